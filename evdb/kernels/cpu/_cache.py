"""Keeps numba's on-disk cache of the kernels honest.

numba keys a cached kernel by the mtime and size of the file that defines it, not by the
helpers inlined into it from other modules (``_common``, ``libm``, ``index``): after an edit
there, every kernel would load its old machine code. So the kernels cache under a directory
named by one digest of all the kernel modules' sources, ``__pycache__/evdb-<digest>/``: other
sources, other directory. A process still running older sources writes its machine code
under the old digest, where a process of the new sources never looks (dropping the old files
alone, as this guard first did, let such a process put stale code back under the current
stamp, and a kernel inlining an edited helper crashed the next process that loaded it).

Directories of other digests are removed once nothing has written to them for an hour; the
flat cache files of numba's own layout are removed at once. A cache elsewhere
(``NUMBA_CACHE_DIR``) or a directory that cannot be written is left to numba, as before.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from numba.core import config as numba_config
from numba.core.caching import InTreeCacheLocator

_PREFIX = "evdb-"
_OLD_STAMP = "evdb-kernels.sha256"  # the first guard's stamp beside the flat files
STALE_AFTER_S = 3600.0  # an older digest's directory is kept this long after its last write


def sources_digest(sources: Path) -> str:
    """The digest of every ``*.py`` in ``sources`` (names and bytes): 16 hex digits."""
    digest = hashlib.sha256()
    for path in sorted(sources.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_dir(sources: Path) -> Path:
    """Where the kernels of ``sources`` as they are now cache their machine code."""
    return sources / "__pycache__" / (_PREFIX + sources_digest(sources))


def drop_stale(sources: Path, *, now: float | None = None) -> list[Path]:
    """Remove the cache files of numba's flat layout under ``sources/__pycache__`` and the
    directories of other digests idle for ``STALE_AFTER_S``; returns what was removed. A cache
    elsewhere (``NUMBA_CACHE_DIR``) or a directory that cannot be written is left alone."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return []
    cache = sources / "__pycache__"
    current = cache_dir(sources).name
    now = time.time() if now is None else now
    removed: list[Path] = []
    try:
        for flat in [*cache.glob("*.nbi"), *cache.glob("*.nbc"), *cache.glob(_OLD_STAMP)]:
            flat.unlink(missing_ok=True)
            removed.append(flat)
        for old in cache.glob(_PREFIX + "*"):
            if old.name != current and old.is_dir() and now - _last_write(old) > STALE_AFTER_S:
                shutil.rmtree(old, ignore_errors=True)
                removed.append(old)
    except OSError:  # a read-only install: numba caches in the user's directory instead
        return removed
    return removed


def _last_write(directory: Path) -> float:
    times = [directory.stat().st_mtime, *(p.stat().st_mtime for p in directory.iterdir())]
    return max(times)


# numba's own locators, in its default order (numba.core.caching), after which this one goes
_NUMBAS = ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator",
           "IPythonCacheLocator", "ZipCacheLocator")  # fmt: skip


class DigestLocator(InTreeCacheLocator):  # type: ignore[misc]
    """numba's in-tree locator, pointed at the digest's directory for the kernel modules."""

    sources = Path(__file__).parent
    digest_dir = str(cache_dir(sources))

    def __init__(self, py_func: Any, py_file: str) -> None:
        super().__init__(py_func, py_file)
        self._cache_path = self.digest_dir

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> Any:
        if Path(py_file).resolve().parent != cls.sources.resolve():
            return None  # another module: numba's own locators
        return super().from_function(py_func, py_file)


def install() -> bool:
    """Ask numba (its public ``CACHE_LOCATOR_CLASSES`` setting) to try ``DigestLocator`` right
    after a user-provided cache directory, which still wins; a list the user set is kept.
    Returns whether the locator is in use."""
    ours = f"{__name__}.{DigestLocator.__qualname__}"
    chosen = numba_config.CACHE_LOCATOR_CLASSES
    if chosen and ours not in chosen:
        return False  # NUMBA_CACHE_LOCATOR_CLASSES: the user's choice
    numba_config.CACHE_LOCATOR_CLASSES = ",".join([_NUMBAS[0], ours, *_NUMBAS[1:]])
    return True


drop_stale(DigestLocator.sources)
install()
