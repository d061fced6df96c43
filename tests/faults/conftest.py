"""Fault injection: a small file system of its own that a test can fill up.

``small_disk`` mounts a tmpfs (``mount -t tmpfs -o size=...``, which needs root: CI runs as
root) and always unmounts it at teardown. Where mounting is not permitted the tests skip,
except under ``CI=true``, where a skip would hide the suite: there they fail.
"""

from __future__ import annotations

import errno
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

SIZE_MB = 24  # room for a spilling table's RocksDB, checkpoints and an export or two


class Disk:
    """A mounted tmpfs, and a filler file that takes its free space and gives it back."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.filler = root / "filler"

    def fill(self, leave: int = 0) -> None:
        """Write the filler until the disk is full (ENOSPC), then give back ``leave`` bytes
        (a write that needs more fails)."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            size = 1 << 20
            while size:  # bounded: each write takes space, each ENOSPC halves the size
                try:
                    os.write(fd, b"\xff" * size)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    size //= 2
        finally:
            os.close(fd)
        if leave:
            os.truncate(self.filler, max(self.filler.stat().st_size - leave, 0))

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def free_bytes(self) -> int:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize


def _mount(where: Path) -> str | None:
    """Mount a tmpfs at where; None when done, else why it cannot be."""
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={SIZE_MB}m", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run mount: {e}"
    if done.returncode != 0:
        return f"mount -t tmpfs failed: {done.stderr.strip() or done.returncode}"
    return None


@pytest.fixture()
def small_disk() -> Iterator[Disk]:
    where = Path(tempfile.mkdtemp(prefix="evdb-faults-"))
    why = _mount(where)
    if why is not None:
        where.rmdir()
        reason = f"no small file system to fill: {why}"
        if os.environ.get("CI") == "true":  # CI runs as root: a skip would hide the suite
            pytest.fail(reason + " (CI must be able to mount a tmpfs)")
        pytest.skip(reason + " (run as root)")
    try:
        yield Disk(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, timeout=30)
        where.rmdir()
