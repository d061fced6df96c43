"""The ``evdb`` command's exit codes: the text its help shows, and the code of each error."""

from __future__ import annotations

import evdb

__all__ = ["EXIT_CODES", "exit_code"]

EXIT_CODES = """\b
Exit codes:
  0  success
  1  failure: an unexpected error (with a traceback), or an expected one that is not
     the command line's fault, such as a database another process holds (one line)
  2  usage: a bad option or value, found by the command line or by evdb (InvalidArgument,
     InvalidType, Config, TableExists errors)
  3  verification failed or data corrupt (evdb.CorruptDataError)
  4  not found: a missing path or file, an unknown table
  5  I/O error: the disk is full or cannot be written (evdb.StorageError, an OSError)
"""


def exit_code(error: BaseException) -> int | None:
    """The exit code of an expected error; None for an unexpected one (a bug)."""
    if isinstance(error, evdb.CorruptDataError):
        return 3
    if isinstance(error, (evdb.TableNotFoundError, FileNotFoundError)):
        return 4
    if isinstance(error, OSError):  # evdb.StorageError, or a write of the command's own
        return 5
    if isinstance(
        error,
        (
            evdb.InvalidArgumentError,
            evdb.InvalidTypeError,
            evdb.ConfigError,
            evdb.TableExistsError,
        ),
    ):
        return 2
    if isinstance(error, evdb.EvdbError):
        return 1
    return None
