"""Read-only shadows: the private directories a read-only ``RocksStore`` opens in place of a
snapshot.

rocksdict rewrites its ``rocksdict-config.json`` on every open, read-only included, so a
read-only open goes through a shadow of links: the snapshot itself keeps every byte and mtime,
and any number of processes may open it at once. Each shadow is flock'ed by the process that
uses it; the shadows of processes that died are swept by the next open.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

from evdb.errors import CorruptDataError

__all__ = ["ReadOnlyShadow"]

_SHADOW_PREFIX = "evdb-ro-"
_SHADOW_OWNER = ".evdb-owner"  # flock'ed by the process that uses the shadow, while it lives
# Linux's per-process links to open descriptors: opening one opens the very file the
# descriptor holds, even after its name is gone (None where there are none: plain links)
_FD_LINKS = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else None


class ReadOnlyShadow:
    """A shadow of the RocksDB directory ``src`` (see ``_make_shadow``), at ``path`` until
    ``remove()``; one never removed is removed when collected, or at exit."""

    def __init__(self, src: Path) -> None:
        self.path, owner, pins = _make_shadow(src)
        self._remove: weakref.finalize[Any, Any] = weakref.finalize(
            self, _remove_shadow_dir, self.path, owner, pins
        )

    def remove(self) -> None:
        """Remove the shadow and let go of its lock and pins; a second call does nothing."""
        self._remove()


def _make_shadow(src: Path) -> tuple[Path, int, list[int]]:
    """A private directory that RocksDB can open read-only in place of src: a symbolic link
    to each of src's files, except rocksdict's own config file, which is copied (rocksdict
    writes it on every open; through a link it would rewrite the snapshot's copy). Whatever
    RocksDB or rocksdict write (the config, an info LOG) lands in the shadow, which
    ``RocksStore.close`` removes. Links, not hard links: the snapshot may be on another file
    system or not writable.

    The snapshot is pinned: each of its files is opened here, and the link points at the
    open descriptor (``/proc/self/fd/N``), not at the name. A writer's flush removes the
    previous checkpoint directory while readers may be opening it; a pinned file stays
    readable, so the reader sees the snapshot it chose, whole, for as long as it is open.
    src gone before its files are all held raises ``CorruptDataError`` (the caller may try
    the checkpoint that replaced it).

    Returns the shadow, the descriptor of its owner lock, held until the shadow is removed,
    and the pins; shadows whose process died first are removed here."""
    if not src.is_dir():
        raise CorruptDataError(f"{src}: RocksDB directory is missing")
    _sweep_dead_shadows()
    shadow = Path(tempfile.mkdtemp(prefix=_SHADOW_PREFIX))
    owner = -1
    pins: list[int] = []
    try:
        # locked before it gets its name, so a sweep never finds it unlocked
        owner = os.open(shadow / f"{_SHADOW_OWNER}.new", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(owner, fcntl.LOCK_EX)
        os.rename(shadow / f"{_SHADOW_OWNER}.new", shadow / _SHADOW_OWNER)
        for entry in os.scandir(src):
            target = shadow / entry.name
            if entry.name == "rocksdict-config.json":
                shutil.copyfile(entry.path, target)
            elif _FD_LINKS is None:
                os.symlink(os.path.abspath(entry.path), target)
            else:
                # (O_NONBLOCK: a FIFO planted there fails RocksDB's open, never hangs this one)
                pins.append(os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK))
                os.symlink(f"{_FD_LINKS}/{pins[-1]}", target)
    except FileNotFoundError as e:  # removed (by a writer's flush) while being pinned
        _remove_shadow_dir(shadow, owner, pins)
        raise CorruptDataError(f"{src}: RocksDB directory is missing ({e})") from e
    except BaseException:
        _remove_shadow_dir(shadow, owner, pins)
        raise
    return shadow, owner, pins


def _remove_shadow_dir(shadow: Path, owner: int, pins: list[int] | None = None) -> None:
    shutil.rmtree(shadow, ignore_errors=True)
    for fd in pins or ():
        os.close(fd)
    if owner >= 0:
        os.close(owner)  # after the removal: a sweep never sees a live shadow unlocked


def _sweep_dead_shadows() -> None:
    """Remove the shadows left by processes that died with a read-only store open (kill -9,
    a crash: no close, no exit handler), which would otherwise pile up in the temporary
    directory, one per crashed server. A live process holds its shadow's owner lock; the
    kernel lets go of it when the process dies, in any PID namespace sharing the directory.
    A shadow without the lock file (being made, or from an older evdb) is left alone."""
    for path in Path(tempfile.gettempdir()).glob(f"{_SHADOW_PREFIX}*"):
        try:
            fd = os.open(path / _SHADOW_OWNER, os.O_RDWR)
        except OSError:  # no lock file, not ours to open, or just removed
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its process is alive
            os.close(fd)
            continue
        _remove_shadow_dir(path, fd)
