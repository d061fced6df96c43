"""Keeps numba's on-disk cache of the kernels honest.

numba keys a cached kernel by the mtime and size of the file that defines it, not by the
helpers inlined into it from other modules (``_common``, ``libm``): after an edit there, every
kernel would load its old machine code. One digest of all the kernel modules' sources guards
the whole cache instead: when it changes, the cached kernels are dropped before any loads
(the package imports this module first, and it checks on import).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_STAMP = "evdb-kernels.sha256"


def drop_stale(sources: Path) -> bool:
    """Drop numba's cache files under ``sources/__pycache__`` when the ``*.py`` files in
    ``sources`` differ from those the cache was built from; returns whether it dropped them.
    A cache elsewhere (``NUMBA_CACHE_DIR``) or a directory that cannot be written is left to
    numba."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return False
    digest = hashlib.sha256()
    for path in sorted(sources.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    cache = sources / "__pycache__"
    stamp = cache / _STAMP
    try:
        if stamp.read_text() == digest.hexdigest():
            return False
    except OSError:
        pass
    try:
        for stale in [*cache.glob("*.nbi"), *cache.glob("*.nbc")]:
            stale.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest.hexdigest())
    except OSError:  # a read-only install: numba caches in the user's directory instead
        return False
    return True


drop_stale(Path(__file__).parent)
