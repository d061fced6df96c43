"""Every exception evdb raises.

All of them derive from :class:`EvdbError`; where a builtin also fits, they inherit it too,
so ``except ValueError`` keeps working for callers that do not know evdb.
"""

from __future__ import annotations


class EvdbError(Exception):
    """Base class of every evdb error."""


class ConfigError(EvdbError, ValueError):
    """A configuration value is out of range or inconsistent."""


class InvalidArgumentError(EvdbError, ValueError):
    """An argument has the right type but a bad value (NaN, wrong shape, bad offsets...)."""


class InvalidTypeError(EvdbError, TypeError):
    """An argument has the wrong type or dtype."""


class TableNotFoundError(EvdbError, KeyError):
    """No table of that name exists in the database."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class TableExistsError(EvdbError, ValueError):
    """A table of that name already exists."""


class CapacityError(EvdbError, ValueError):
    """A batch needs more resident rows than the tier can hold and there is nowhere to spill."""


class DatabaseLockedError(EvdbError, RuntimeError):
    """Another process (or another open handle) holds the database directory for writing."""


class DatabaseClosedError(EvdbError, RuntimeError):
    """The database was closed; its tables can no longer be used."""


class CorruptDataError(EvdbError, RuntimeError):
    """A file of the database is damaged or of an unknown format."""


class DatabaseNotFoundError(EvdbError, FileNotFoundError):
    """A path that holds no evdb database (for a read-only open, or a tool)."""


class KeyCollisionError(EvdbError, ValueError):
    """Two different strings hash to the same key in a table that keeps its strings."""


class ReadOnlyError(EvdbError, RuntimeError):
    """A write to a database opened with ``read_only=True``."""


class CollectiveError(EvdbError, RuntimeError):
    """A collective call of a sharded database failed: the ranks called different operations
    (a rank skipped one), or a rank died or stopped answering within the process group's
    timeout. The job restarts from its last sharded checkpoint."""


class ShardLayoutError(EvdbError, ValueError):
    """A sharded database or checkpoint does not fit this job: another world size, or other
    tables or placements than the ranks agree on."""


class ConcurrentModificationError(EvdbError, RuntimeError):
    """A table changed between two chunks of a scan (``Table.items``): rows may have moved
    between tiers, so the scan could miss or repeat some. Iterate again, or hold the writes
    until the scan ends (as ``RuntimeError`` does for a dict changed while iterated)."""


class StorageError(EvdbError, OSError):
    """The storage under a database, checkpoint, export or publication failed an I/O call:
    the disk is full (``errno.ENOSPC``), a file cannot be written (``EACCES``, ``EROFS``) or
    the device fails (``EIO``). ``errno`` says which when it is known, ``filename`` names
    the path, and the message names both.

    Nothing acknowledged is lost: the call that raised it changed nothing (or, where it says
    so, part of what it was asked), and the database keeps working once the cause is gone
    (free space, then call again: ``Database.flush`` and ``Database.close`` resume a RocksDB
    that stopped on the error). Corruption stays ``CorruptDataError``."""

    def __str__(self) -> str:  # OSError's "[Errno 28] ...: 'path'" buries the message
        return str(self.strerror if self.strerror is not None else super().__str__())
