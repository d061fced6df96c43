"""What tests compare a directory by, to show that a call wrote nothing under it."""

from __future__ import annotations

from pathlib import Path


def fingerprint(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file's and directory's mtime, size and bytes (directories: their entry names)."""
    out = {}
    for p in [*sorted(root.rglob("*")), root]:
        st = p.lstat()
        body = (
            p.read_bytes()
            if p.is_file()
            else "\n".join(sorted(x.name for x in p.iterdir())).encode()
        )
        out[str(p.relative_to(root))] = (st.st_mtime_ns, st.st_size, body)
    return out
