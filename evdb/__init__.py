"""evdb: a tiered-storage embedding database for dynamic ID spaces.

The public surface is exactly ``__all__``.
"""

from __future__ import annotations

from evdb import admission, checkpoint, optim
from evdb import initializers as init
from evdb.checkpoint import verify
from evdb.config import DiskConfig, DramConfig, HbmConfig, TableConfig
from evdb.database import Database, open
from evdb.errors import (
    CapacityError,
    CollectiveError,
    ConcurrentModificationError,
    ConfigError,
    CorruptDataError,
    DatabaseClosedError,
    DatabaseLockedError,
    DatabaseNotFoundError,
    EvdbError,
    InvalidArgumentError,
    InvalidTypeError,
    KeyCollisionError,
    ReadOnlyError,
    ShardLayoutError,
    StorageError,
    TableExistsError,
    TableNotFoundError,
)
from evdb.io.export import export
from evdb.io.importer import import_vectors
from evdb.keys import hash_strings
from evdb.table import Pulled, Table

__version__ = "0.1.0"

__all__ = [
    "CapacityError",
    "CollectiveError",
    "ConcurrentModificationError",
    "ConfigError",
    "CorruptDataError",
    "Database",
    "DatabaseClosedError",
    "DatabaseLockedError",
    "DatabaseNotFoundError",
    "DiskConfig",
    "DramConfig",
    "EvdbError",
    "HbmConfig",
    "InvalidArgumentError",
    "InvalidTypeError",
    "KeyCollisionError",
    "Pulled",
    "ReadOnlyError",
    "ShardLayoutError",
    "StorageError",
    "Table",
    "TableConfig",
    "TableExistsError",
    "TableNotFoundError",
    "admission",
    "checkpoint",
    "export",
    "hash_strings",
    "import_vectors",
    "init",
    "open",
    "optim",
    "verify",
]
