"""``Database``: the directory, the global step, the set of tables, flush and close."""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from evdb import persist
from evdb.admission import AdmissionPolicy, AdmitAll
from evdb.config import DramConfig, TableConfig
from evdb.errors import (
    ConfigError,
    CorruptDataError,
    DatabaseClosedError,
    DatabaseLockedError,
    InvalidArgumentError,
    TableExistsError,
    TableNotFoundError,
)
from evdb.initializers import Initializer, Normal
from evdb.keys import KeyType
from evdb.optim import SGD, Optimizer
from evdb.table import Table

__all__ = ["Database", "open"]

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def _parse_table_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"name must be 1-128 characters of letters, digits, '_', '.', '-' not starting "
            f"with '.' or '-', got {name!r}"
        )
    return name


class Database:
    """A directory of dynamic embedding tables sharing one global step.

    Open it with :func:`evdb.open`. One process holds a directory open at a time (a lock file
    enforces it). ``close()`` (or leaving the ``with`` block) flushes.

    Examples
    --------
    >>> import tempfile, evdb
    >>> path = tempfile.mkdtemp()
    >>> with evdb.open(path) as db:
    ...     t = db.create_table("user", dim=8)
    ...     _ = db.advance(3)
    >>> with evdb.open(path) as db:
    ...     db.step, db.tables()
    (3, ['user'])
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(self.path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise DatabaseLockedError(
                f"path: {self.path} is open in another process or handle; close it first"
            ) from None
        self._closed = False
        self._tables: dict[str, Table] = {}
        self._dropped: set[str] = set()
        self._step = 0
        try:
            self._load()
        except BaseException:
            self._release()
            raise

    def _load(self) -> None:
        meta = persist.read_manifest(self.path)
        if meta is None:
            return
        self._step = int(meta["step"])
        for name, cfg in meta["tables"].items():
            try:
                config = TableConfig.from_dict(cfg)
                table = Table(self, name, config)
                table._load_state(persist.read_table(self.path, name))
            except (KeyError, TypeError, ValueError) as e:
                raise CorruptDataError(f"{self.path}: table {name!r} cannot be loaded ({e})") from e
            self._tables[name] = table

    # -- lifecycle ------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise DatabaseClosedError(f"database {self.path} is closed")

    def flush(self) -> None:
        """Write every table and the step to the directory (atomically per file)."""
        self._check_open()
        for name, table in self._tables.items():
            persist.write_table(self.path, name, table._state_arrays())
        persist.write_manifest(
            self.path, self._step, {n: t.config.to_dict() for n, t in self._tables.items()}
        )
        for name in self._dropped - self._tables.keys():
            persist.table_path(self.path, name).unlink(missing_ok=True)
        self._dropped.clear()

    def _release(self) -> None:
        self._closed = True
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        os.close(self._lock)

    def close(self) -> None:
        """Flush and release the directory. Closing twice is a no-op."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._release()

    def __enter__(self) -> Database:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the global step ------------------------------------------------------------------
    @property
    def step(self) -> int:
        """The global step: the trainer's clock for TTL and LFU ageing."""
        return self._step

    def advance(self, n: int = 1) -> int:
        """Move the global step forward by n >= 0; returns the new step."""
        self._check_open()
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidArgumentError(f"n must be an int >= 0, got {n!r}")
        self._step += n
        return self._step

    # -- tables ---------------------------------------------------------------------------
    def create_table(
        self,
        name: str,
        dim: int,
        *,
        key_type: KeyType = "int64",
        initializer: Initializer | None = None,
        admission: AdmissionPolicy | None = None,
        optimizer: Optimizer | None = None,
        ttl_steps: int | None = None,
        l2_threshold: float | None = None,
        default_value: Literal["init"] | float = "init",
        dram_rows: int | None = None,
        dram: DramConfig | None = None,
    ) -> Table:
        """Create a table; see ``TableConfig`` for each option.

        ``dram_rows`` is shorthand for ``dram=DramConfig(capacity_rows=dram_rows)``.
        Raises ``TableExistsError`` (a ValueError) if the name is taken.
        """
        self._check_open()
        _parse_table_name(name)
        if name in self._tables:
            raise TableExistsError(f"name: table {name!r} already exists in {self.path}")
        if dram is not None and dram_rows is not None:
            raise ConfigError("pass dram_rows or dram=DramConfig(...), not both")
        config = TableConfig(
            dim=dim,
            key_type=key_type,
            initializer=Normal(0.0, 0.01, 0) if initializer is None else initializer,
            admission=AdmitAll() if admission is None else admission,
            optimizer=SGD() if optimizer is None else optimizer,
            ttl_steps=ttl_steps,
            l2_threshold=l2_threshold,
            default_value=default_value,
            dram=DramConfig(capacity_rows=dram_rows) if dram is None else dram,
        )
        table = Table(self, name, config)
        self._tables[name] = table
        self._dropped.discard(name)
        return table

    def table(self, name: str) -> Table:
        """The table called name; ``TableNotFoundError`` (a KeyError) if there is none."""
        self._check_open()
        try:
            return self._tables[name]
        except (KeyError, TypeError):
            raise TableNotFoundError(
                f"name: no table {name!r} in {self.path}; tables: {sorted(self._tables)}"
            ) from None

    def tables(self) -> list[str]:
        """Names of the tables, sorted."""
        self._check_open()
        return sorted(self._tables)

    def drop_table(self, name: str) -> None:
        """Delete a table and its rows (from disk at the next flush)."""
        self.table(name)
        del self._tables[name]
        self._dropped.add(name)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"step={self._step}, tables={sorted(self._tables)}"
        return f"Database({str(self.path)!r}, {state})"


def open(path: str | os.PathLike[str]) -> Database:
    """Open (creating if missing) the database directory at path."""
    return Database(path)
