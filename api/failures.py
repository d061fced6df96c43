"""Why a publication was refused, and the follower's one-line logs of it (``api.follow``).

A refused publication is counted by reason and logged as one line naming the cause and the
file, never a traceback; a failure that repeats poll after poll (a follower polls every
second) is logged once, then at most every ``REPEAT_LOG_S`` with how often it repeated.
"""

from __future__ import annotations

import logging
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

from evdb import checkpoint as _checkpoint
from evdb.errors import EvdbError

__all__ = ["EXPECTED", "REPEAT_LOG_S", "Failure", "FailureLog", "cause", "diagnose"]

REPEAT_LOG_S = 300.0  # a failure that repeats poll after poll is logged again after this
_FAILURES_KEPT = 256  # distinct failures remembered for REPEAT_LOG_S (oldest forgotten first)

# What reading or applying a publication can raise when a file is damaged, cannot be read, or
# is too big for this server: counted and logged as one line, never a traceback. Anything
# else is a bug (logged with its traceback, counted as "error").
EXPECTED = (EvdbError, OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, MemoryError)


def cause(error: BaseException, reason: str, where: Path | None = None) -> tuple[str, str]:
    """(reason, detail) of an error met reading or applying a publication (at ``where``), for
    the metrics and the one log line: a file that cannot be opened is "unreadable"
    (permission denied is not damage, whatever ``reason`` the step that met it says), no
    memory for a delta is "memory", another I/O error "read"; the detail names the file (the
    error's, else ``where``)."""
    for e in (error, error.__cause__):  # evdb wraps what it cannot read in CorruptDataError
        if isinstance(e, PermissionError):
            return "unreadable", f"{e.filename or where}: permission denied"
    if isinstance(error, MemoryError):
        reason, detail = "memory", f"not enough memory to apply it ({error})"
    elif isinstance(error, OSError) and not isinstance(error, EvdbError) and error.filename:
        return "read", f"{error.filename}: {error.strerror or error}"
    else:
        detail = str(error) or type(error).__name__
    if where is not None and str(where) not in detail:
        detail = f"{where}: {detail}"
    return reason, detail


def diagnose(path: Path, why: str) -> tuple[str, str]:
    """The cause of ``check_publication``'s "checksum" or "manifest" verdict on the
    publication at path: it gives no more than the word, and says "checksum" for a file it
    cannot open too. The check is made again to name the file and tell which (a refused
    publication is read twice; ``check_publication`` returning its error would spare that)."""
    try:
        _checkpoint.verify(path)
    except EXPECTED as e:
        return cause(e, why, path)
    return why, f"{path}: refused, then passed when checked again (it changed meanwhile)"


Failure = tuple[str, int | None, str]  # reason, seq, detail


class FailureLog:
    """Logs a failure once, as one line, and again only after ``REPEAT_LOG_S`` while it
    repeats (saying how often it did), so a follower that meets the same failure at every
    poll does not bury the log."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._seen: dict[Failure, tuple[float, int]] = {}  # -> (logged at, repeats since)
        self._lock = threading.Lock()

    def warning(self, key: Failure, msg: str, *args: Any, exc_info: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < REPEAT_LOG_S:
                self._seen[key] = (last[0], last[1] + 1)
                return
            self._seen.pop(key, None)
            if len(self._seen) >= _FAILURES_KEPT:
                del self._seen[next(iter(self._seen))]
            self._seen[key] = (now, 0)
        if last is not None:
            msg += " (%d more times in the last %.0f s)"
            args = (*args, last[1] + 1, now - last[0])
        self.logger.warning(msg, *args, exc_info=exc_info)

    def forget_through(self, seq: int | None) -> None:
        """Forget the failures of publications up to seq (served now) and of no publication
        (HEAD): met again later, they are news."""
        with self._lock:
            for key in [k for k in self._seen if k[1] is None or seq is None or k[1] <= seq]:
                del self._seen[key]
