"""``convert``: a database's tables with their rows in another dtype, in a new database.

A table's row dtype is fixed for its life (``TableConfig.dtype``); changing it is this
explicit offline step, never an implicit one. The source is opened read-only and never
changes. Every row keeps its whole record (slots, pull count, last step, version, flags);
only its values are rounded to the new dtype, to nearest even (widening to float32 is exact),
and its slots to the new ``slot_dtype``: by default float32 slots stay float32 and half
slots follow the values (half slots live only on values of their own format).
Each table keeps what is not rows as resharding carries it (pushes, for Adam's bias
correction; admission's pending counts; eviction counters) and its original strings, so
training resumed from the converted database goes on as from the source, at the same step.

float16 holds magnitudes up to 65504: a value or slot beyond it is refused (naming the table
and the key) before the destination is kept, instead of becoming infinity; bfloat16 has float32's
range. A failed conversion removes the destination it created.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evdb import database as _database
from evdb.config import ROUNDINGS, ROW_DTYPES, TableConfig
from evdb.errors import InvalidArgumentError
from evdb.optim import Adagrad
from evdb.storage import POINTER
from evdb.table import Table

__all__ = ["convert"]

FLOAT16_MAX = 65504.0

Progress = Callable[[int, int], object]


def convert(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    dtype: str,
    *,
    tables: Sequence[str] | None = None,
    rounding: str | None = None,
    slot_dtype: str | None = None,
    chunk_rows: int = 65536,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write the database at ``src`` to a new database at ``dest`` with the rows of
    ``tables`` (default: all) in ``dtype`` ("float32", "bfloat16" or "float16"); the other
    tables are copied as they are. ``rounding`` sets the converted tables' push rounding
    (default: the source table's); ``slot_dtype`` their slots' dtype ("float32", or
    ``dtype``; default: float32 slots stay float32, half slots follow the values). ``dest``
    must not exist.

    Returns ``{"src", "dest", "dtype", "step", "tables": {name: {"rows", "from", "to",
    "slots_from", "slots_to"}}}``.

    Raises
    ------
    InvalidArgumentError
        A bad argument (naming it), an unknown table, an existing ``dest``, or a value or
        slot beyond float16's range (naming the table and the key).
    ConfigError
        A ``slot_dtype`` the converted values cannot take (half slots on other values).
    FileNotFoundError
        ``src`` is not an evdb database.
    """
    source, target = _parse_paths(src, dest)
    if dtype not in ROW_DTYPES:
        raise InvalidArgumentError(f"dtype must be one of {ROW_DTYPES}, got {dtype!r}")
    if rounding is not None and rounding not in ROUNDINGS:
        raise InvalidArgumentError(f"rounding must be one of {ROUNDINGS} or None, got {rounding!r}")
    if slot_dtype is not None and slot_dtype not in ROW_DTYPES:
        raise InvalidArgumentError(
            f"slot_dtype must be one of {ROW_DTYPES} or None, got {slot_dtype!r}"
        )
    if slot_dtype not in (None, "float32", dtype):  # refused before anything is written
        TableConfig(dim=1, optimizer=Adagrad(), dtype=dtype, slot_dtype=slot_dtype)  # type: ignore[arg-type]
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise InvalidArgumentError(f"chunk_rows must be an int >= 1, got {chunk_rows!r}")
    if tables is not None and (
        isinstance(tables, str) or not all(isinstance(t, str) for t in tables)
    ):
        raise InvalidArgumentError(f"tables must be a sequence of table names, got {tables!r}")

    with _database.open(source, read_only=True) as db:
        names = db.tables()
        chosen = list(names) if tables is None else list(dict.fromkeys(tables))
        for name in chosen:
            if name not in names:
                raise InvalidArgumentError(
                    f"tables: no table {name!r} in {source}; tables: {names}"
                )
        total = sum(len(db.table(n)) for n in names)
        os.mkdir(target)  # fails on an existing entry, so nothing of another's is taken
        try:
            with _database.open(target) as out:
                out.advance(db.step)
                done = 0
                report = {}
                for name in names:
                    old = db.table(name)
                    c = old.config
                    to: str = c.dtype
                    slots_to: str = c.slot_dtype
                    if name in chosen:
                        to, slots_to = dtype, _slots_to(c.slot_dtype, dtype, slot_dtype)
                    new = _create_like(out, old, to, slots_to, rounding if name in chosen else None)
                    for n in _copy_rows(old, new, chunk_rows):
                        done += n
                        if progress is not None:
                            progress(done, total)
                    new.absorb([old.summary()], _everything, first=True)
                    report[name] = {
                        "rows": len(new),
                        "from": c.dtype,
                        "to": to,
                        "slots_from": c.slot_dtype,
                        "slots_to": slots_to,
                    }
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        return {
            "src": str(source),
            "dest": str(target),
            "dtype": dtype,
            "step": db.step,
            "tables": report,
        }


def _parse_paths(src: Any, dest: Any) -> tuple[Path, Path]:
    for name, value in (("src", src), ("dest", dest)):
        if not isinstance(value, (str, os.PathLike)):
            raise InvalidArgumentError(f"{name} must be a str or os.PathLike, got {value!r}")
    source, target = Path(src), Path(dest)
    if not (source / POINTER).is_file():
        what = "does not exist" if not source.exists() else f"has no {POINTER}"
        raise FileNotFoundError(f"src: {source} {what}: not an evdb database")
    if os.path.lexists(target):
        raise InvalidArgumentError(f"dest: {target} exists; convert writes a new database")
    if not target.parent.is_dir():
        raise InvalidArgumentError(f"dest: the directory {target.parent} does not exist")
    return source, target


def _slots_to(old: str, dtype: str, asked: str | None) -> str:
    """The converted table's slot dtype: as asked, else float32 slots stay float32 and half
    slots follow the values (float32 where the values are float32)."""
    if asked is not None:
        return asked
    return "float32" if old == "float32" else dtype


def _create_like(
    out: _database.Database, old: Table, dtype: str, slot_dtype: str, rounding: str | None
) -> Table:
    """A table configured as old's but for its row and slot dtypes (and its disk tier's,
    which follows the rows') and, if given, its rounding."""
    c: TableConfig = old.config
    disk = None if c.disk is None else dataclasses.replace(c.disk, dtype=dtype)  # type: ignore[arg-type]
    return out.create_table(
        old.name,
        c.dim,
        key_type=c.key_type,
        initializer=c.initializer,
        admission=c.admission,
        optimizer=c.optimizer,
        ttl_steps=c.ttl_steps,
        l2_threshold=c.l2_threshold,
        default_value=c.default_value,
        keep_strings=c.keep_strings,
        dram=c.dram,
        disk=False if disk is None else disk,
        hbm=c.hbm,
        dtype=dtype,  # type: ignore[arg-type]  # checked against ROW_DTYPES
        slot_dtype=slot_dtype,  # type: ignore[arg-type]  # likewise
        rounding=c.rounding if rounding is None else rounding,  # type: ignore[arg-type]
    )


def _copy_rows(old: Table, new: Table, chunk_rows: int) -> Any:
    """Every stored row of old (expired ones too: compaction, not conversion, drops them)
    into new, record for record; yields the rows copied a chunk."""
    for keys, records in old.records(chunk_rows):
        if new.config.dtype == "float16":
            _check_float16(old.name, keys, records.values)
        if new.config.slot_dtype == "float16":
            _check_float16(old.name, keys, records.slots, "slot_dtype", "the slot ")
        new.restore_records(keys, records)
        if old.keeps_strings:
            strings = old.strings(keys)
            known = np.array([s is not None for s in strings], dtype=bool)
            new.restore_strings(keys[known], [s for s in strings if s is not None])
        yield keys.shape[0]


def _check_float16(
    table: str, keys: np.ndarray, values: np.ndarray, arg: str = "dtype", what: str = ""
) -> None:
    beyond = ~(np.abs(values) <= FLOAT16_MAX).all(axis=1)  # NaN is beyond too
    if beyond.any():
        i = int(np.flatnonzero(beyond)[0])
        worst = values[i][~(np.abs(values[i]) <= FLOAT16_MAX)][0]
        raise InvalidArgumentError(
            f"{arg}: table {table!r}, key {int(keys[i])} holds {what}{float(worst)!r}, "
            f"beyond float16's +-{FLOAT16_MAX:g}; convert it to bfloat16 (float32's range) "
            "instead"
        )


def _everything(keys: np.ndarray) -> np.ndarray:
    return np.ones(keys.shape[0], dtype=bool)
