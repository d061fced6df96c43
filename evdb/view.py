"""Reading a table at an explicit step, with newer rows layered over it: the read half of a
table, as one protocol that a ``Table``, a view of a publication and (in part) a
``ShardedTable`` satisfy.

A server that follows a trainer's publications (``evdb serve ROOT --follow``) serves a full
snapshot, opened read-only and never written, with the rows of every delta since that full
held in memory over it (``evdb.view_overlay``)::

    view = TableView(table, step, overlay)

        overlay   3: row     9: tombstone     12: row       sorted keys (two layers)
        table     1    3    5    9    11                    the full's rows, read-only
        step      the publication's: every TTL verdict, the overlay's and the table's

    view.lookup([1, 3, 9, 12, 4])  ->  table's 1, overlay's 3, default, overlay's 12, default

The view reads at its own step, passed to the table with every call (``step=``), never set in
per-thread state: views of one full share its database, each at its own step. A view over no
overlay is the table at a step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

import numpy as np

from evdb._types import BoolArray, Float32Array, Int64Array
from evdb.bags import parse_lookup
from evdb.config import TableConfig
from evdb.errors import InvalidArgumentError
from evdb.kernels import backend
from evdb.keys import normalize_keys
from evdb.neighbors import neighbors as _neighbors
from evdb.records import RecordBatch
from evdb.ttl import min_live_step
from evdb.view_overlay import Overlay, Rows

if TYPE_CHECKING:
    from evdb.quantized import QuantizedTable
    from evdb.table import Table

__all__ = ["Overlay", "ReadableTable", "Rows", "TableView"]

_kernels = backend("cpu")


@runtime_checkable
class ReadableTable(Protocol):
    """The read half of a table, at the step it reads at: what a server, a dashboard or an
    inference binding needs, and all they may assume. ``Table`` satisfies it at ``db.step``,
    :class:`TableView` at its own step (``ShardedTable`` lacks ``count``, ``records``,
    ``neighbors``, ``strings``, ``step`` and lookup's ``out``/``promote``). None of it creates
    a row or counts toward admission:

    ====================================  ===============================================
    ``lookup(keys, offsets, ...)``        rows (n, dim), or bags (B, dim); a key without
                                          a live row reads its default value
    ``contains(keys)``                    (n,) bool: whether each key has a live row
    ``count()``, ``len()``                live rows
    ``records(chunk_rows, live_only=)``   ``(keys, RecordBatch)`` chunks, each row once
    ``items(chunk_rows)``                 ``(keys, values)`` chunks of the live rows
    ``neighbors(query, k, metric)``       exact top-k among the live rows
    ``strings(keys)``, ``keeps_strings``  the keys' original strings (None: unknown)
    ``stats()``                           counts; ``rows`` is ``count()``
    ``name``, ``dim``, ``config``         what the table is
    ``step``                              the step TTL verdicts are made at
    ====================================  ===============================================

    Examples
    --------
    >>> import tempfile, evdb
    >>> from evdb.view import ReadableTable, TableView
    >>> with evdb.open(tempfile.mkdtemp()) as db:
    ...     t = db.create_table("w", dim=2)
    ...     isinstance(t, ReadableTable), isinstance(TableView(t), ReadableTable)
    (True, True)
    """

    @property
    def name(self) -> str: ...
    @property
    def dim(self) -> int: ...
    @property
    def config(self) -> TableConfig: ...
    @property
    def step(self) -> int:
        """The step TTL verdicts are made at."""
        ...

    @property
    def keeps_strings(self) -> bool: ...

    def lookup(
        self,
        keys: Any,
        offsets: Any = None,
        weights: Any = None,
        combiner: str | None = None,
        max_norm: float | None = None,
        *,
        out: Float32Array | None = None,
        promote: bool = False,
        found: BoolArray | None = None,
    ) -> Float32Array: ...

    def contains(self, keys: Any) -> BoolArray: ...
    def count(self) -> int: ...
    def __len__(self) -> int: ...
    def records(
        self, chunk_rows: int = 65536, *, live_only: bool = False, strict: bool = True
    ) -> Iterator[tuple[Int64Array, RecordBatch]]: ...
    def items(self, chunk_rows: int = 65536) -> Iterator[tuple[Int64Array, Float32Array]]: ...
    def neighbors(
        self, query: Any, k: int = 10, metric: str = "cosine", *, as_strings: bool = False
    ) -> tuple[Any, Float32Array]: ...
    def strings(self, keys: Any) -> list[str | None]: ...
    def stats(self) -> dict[str, Any]: ...


class TableView:
    """A table read at an explicit step, with an :class:`Overlay` of newer rows over it:
    the read half of the table (:class:`ReadableTable`), as the trainer's table was at that
    step. The table must not change while the view is read (a read-only database).

    Parameters
    ----------
    table : Table or QuantizedTable
        The rows under the overlay (a full snapshot's table, or its quantised copy: a
        follower serving quantised, whose overlay quantises as well).
    step : int, optional
        The step TTL verdicts are made at, the overlay's and the table's (default: the
        table's ``step``).
    overlay : Overlay, optional
        Newer rows and tombstones over the table's (default: none; the view is then the
        table at ``step``).

    Examples
    --------
    >>> import tempfile, numpy as np, evdb
    >>> from evdb.view import Overlay, TableView
    >>> from evdb.publish import Delta
    >>> with evdb.open(tempfile.mkdtemp()) as db:
    ...     t = db.create_table("w", dim=2, ttl_steps=5, default_value=0.0)
    ...     t.upsert([1, 2, 3], np.ones((3, 2), np.float32))      # at step 0
    ...     d = Delta(np.array([4]), np.full((1, 2), 4, np.float32), np.array([5]), np.array([2]))
    ...     v = TableView(t, 5, Overlay.empty(2).applied([d]))    # 4 is new, 2 is removed
    ...     v.lookup([1, 2, 4]).tolist(), len(v), len(TableView(t, 6))  # at 6, step 0 expired
    ([[1.0, 1.0], [0.0, 0.0], [4.0, 4.0]], 3, 0)
    """

    def __init__(
        self,
        table: Table | QuantizedTable,
        step: int | None = None,
        overlay: Overlay | None = None,
    ):
        if overlay is not None and overlay.dim != table.dim:
            raise InvalidArgumentError(
                f"overlay: rows of dim {overlay.dim} over table {table.name!r} of dim {table.dim}"
            )
        self.table = table
        self.overlay = overlay if overlay is not None else Overlay.empty(table.dim)
        self._layers = self.overlay.layers  # the overlay never changes: read once
        self._step = table.step if step is None else int(step)
        self._count: tuple[int, int, int] | None = None  # (step, table version, count)

    # -- what the table is ----------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.table.name

    @property
    def dim(self) -> int:
        return self.table.dim

    @property
    def config(self) -> TableConfig:
        return self.table.config

    @property
    def step(self) -> int:
        """The step this view reads at."""
        return self._step

    @property
    def keeps_strings(self) -> bool:
        return self.table.keeps_strings

    def _at(self, step: int | None) -> tuple[int, int]:
        s = self._step if step is None else int(step)
        return s, min_live_step(s, self.table.config.ttl_steps)

    def __repr__(self) -> str:
        return f"TableView({self.name!r}, step={self._step}, overlay_rows={self.overlay.n_rows})"

    # -- reads ----------------------------------------------------------------------------
    def lookup(
        self,
        keys: Any,
        offsets: Any = None,
        weights: Any = None,
        combiner: str | None = None,
        max_norm: float | None = None,
        *,
        out: Float32Array | None = None,
        promote: bool = False,
        found: BoolArray | None = None,
        step: int | None = None,
    ) -> Float32Array:
        """``Table.lookup`` at the view's step (or ``step``), the overlay's rows and
        tombstones over the table's: the same arguments, checks and answer, bit for bit
        (bags are combined by the same ``gather_combine`` kernel the table uses for rows
        read from disk)."""
        layers = self._layers
        if not layers:  # the table at the view's step: one call more than the table's own
            return self.table.lookup(
                keys, offsets, weights, combiner, max_norm,
                out=out, promote=promote, found=found,
                step=self._step if step is None else step,
            )  # fmt: skip
        s, min_live = self._at(step)
        table = self.table
        k = normalize_keys(keys, table.config.key_type)
        n = k.shape[0]
        bags, shape = parse_lookup(n, table.dim, offsets, weights, combiner, max_norm, out, found)
        have = np.empty(n, dtype=bool) if found is None else found
        values = table.lookup(
            k, out=out if bags is None else None, promote=promote, found=have, step=s
        )
        for rows in layers:
            hit, at = rows.find(k)
            if hit.size == 0:
                continue
            live = rows.live(min_live, at)
            values[hit[live]] = self.overlay.decode(rows, at[live])
            have[hit] = live
            dead = hit[~live]
            if dead.size:
                values[dead] = table.defaults(k[dead])
        if bags is None:
            return values
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        index = np.arange(n, dtype=np.int64)
        _kernels.gather_combine(
            values, index, bags.bounds, bags.weights, bags.combiner, bags.max_norm, out
        )
        return out

    def contains(self, keys: Any, *, step: int | None = None) -> BoolArray:
        """(n,) bool: whether each key has a live row in the view (at ``step``)."""
        s, min_live = self._at(step)
        k = normalize_keys(keys, self.table.config.key_type)
        live = self.table.contains(k, step=s)
        for rows in self._layers:
            hit, at = rows.find(k)
            live[hit] = rows.live(min_live, at)
        return live

    def count(self, *, step: int | None = None) -> int:
        """Live rows of the view (at ``step``): the table's, less those the overlay replaces
        or removes, plus the overlay's live rows."""
        s, min_live = self._at(step)
        if not self.overlay.n_rows:
            return self.table.count(step=s)
        meta = getattr(self.table, "meta", None)  # a quantised table never changes: no meta
        version = 0 if meta is None else meta.version
        cached = self._count
        if cached is not None and cached[:2] == (s, version):
            return cached[2]
        rows = self.overlay.merged  # keys and steps only: no rows decoded
        shadowed = int(np.count_nonzero(self.table.contains(rows.keys, step=s)))
        n = self.table.count(step=s) - shadowed + int(np.count_nonzero(rows.live(min_live)))
        self._count = (s, version, n)
        return n

    def __len__(self) -> int:
        return self.count()

    def records(
        self,
        chunk_rows: int = 65536,
        *,
        live_only: bool = False,
        strict: bool = True,
        step: int | None = None,
    ) -> Iterator[tuple[Int64Array, RecordBatch]]:
        """``Table.records`` of the view: the table's records the overlay leaves, then the
        overlay's rows (tombstones never; expired ones unless ``live_only``). An overlay row
        carries values and ``last_step`` only, as a delta does: ``freq`` 0, ``version`` 0,
        slots and flags zero."""
        s, min_live = self._at(step)
        over = self.overlay.rows
        for keys, recs in self.table.records(
            chunk_rows, live_only=live_only, strict=strict, step=s
        ):
            mine = ~over.holds(keys)
            if mine.all():
                yield keys, recs
            elif mine.any():
                yield keys[mine], recs.take(mine)
        keep = over.live(min_live) if live_only else ~over.removed
        keys, values, last = over.keys[keep], over.values[keep], over.last_step[keep]
        n_slots = self.table.config.optimizer.n_slots(self.dim)
        for a in range(0, keys.shape[0], chunk_rows):
            b = min(a + chunk_rows, keys.shape[0])
            yield (
                keys[a:b],
                RecordBatch(
                    values=values[a:b],
                    slots=np.zeros((b - a, n_slots), np.float32),
                    freq=np.zeros(b - a, np.uint32),
                    last_step=last[a:b],
                    version=np.zeros(b - a, np.uint64),
                ),
            )

    def items(
        self, chunk_rows: int = 65536, *, step: int | None = None
    ) -> Iterator[tuple[Int64Array, Float32Array]]:
        """``Table.items`` of the view: ``(keys, values)`` chunks of its live rows."""
        for keys, recs in self.records(chunk_rows, live_only=True, step=step):
            yield keys, recs.values

    def live_values(self, *, step: int | None = None) -> Iterator[tuple[Float32Array, Int64Array]]:
        """``Table.live_values`` of the view: the table's live rows the overlay leaves, then
        the overlay's live rows."""
        s, min_live = self._at(step)
        over = self.overlay.rows
        for values, keys in self.table.live_values(step=s):
            mine = ~over.holds(keys)
            if mine.all():
                yield values, keys
            elif mine.any():
                yield values[mine], keys[mine]
        live = over.live(min_live)
        if live.any():
            yield over.values[live], over.keys[live]

    def neighbors(
        self,
        query: Any,
        k: int = 10,
        metric: str = "cosine",
        *,
        as_strings: bool = False,
        step: int | None = None,
    ) -> tuple[Any, Float32Array]:
        """``Table.neighbors`` over the view's live rows: a key's query row is the view's
        (its overlay row, else the table's), the rows the overlay replaces or removes leave
        the scan and its live rows join it."""
        s, _ = self._at(step)
        if not self.overlay.n_rows:
            return self.table.neighbors(query, k, metric, as_strings=as_strings, step=s)
        # evdb.neighbors reads lookup, live_values, strings and config: the view has them all
        view = self if step is None else TableView(self.table, s, self.overlay)
        return _neighbors(cast("Table", view), query, k, metric, as_strings)

    def strings(self, keys: Any) -> list[str | None]:
        """``Table.strings`` (the strings the table keeps; a delta carries none)."""
        return self.table.strings(keys)

    def stats(self) -> dict[str, Any]:
        """``Table.stats`` of the table under the view, with the view's ``rows`` and
        ``step``, and ``overlay_rows`` (rows and tombstones held over the table)."""
        return {
            **self.table.stats(),
            "rows": self.count(),
            "step": self._step,
            "overlay_rows": self.overlay.n_rows,
        }


if TYPE_CHECKING:  # mypy checks that both kinds of table satisfy the protocol

    def _table_reads(t: Table) -> ReadableTable:
        return t

    def _view_reads(v: TableView) -> ReadableTable:
        return v
