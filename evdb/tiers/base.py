"""The contract every storage tier keeps.

A tier stores fixed-width records (see ``evdb.records``) by int64 key and knows nothing of what
the fields mean to an optimizer. Callers ask about capabilities (``persistent``, ``device``),
never about a tier's class, so a chain can stack any tiers (HBM over DRAM over RocksDB): a
chain of tiers is itself a ``Tier`` (``evdb.tiers.chain.ChainTier``), the backing of the chain
above it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from evdb._types import BoolArray, Float32Array, Int64Array
from evdb.bags import Bags
from evdb.records import RecordBatch


class Tier(ABC):
    """A keyed store of row records."""

    name: str = ""

    @property
    @abstractmethod
    def persistent(self) -> bool:
        """True when rows survive the process (the bottom of a chain)."""

    @property
    @abstractmethod
    def device(self) -> str:
        """Where rows live: "cpu" or "cuda:N"."""

    @property
    @abstractmethod
    def capacity_rows(self) -> int | None:
        """Most rows the tier holds; None = unbounded."""

    @abstractmethod
    def __len__(self) -> int:
        """Rows stored, expired ones included (the tier does not know the clock)."""

    @abstractmethod
    def get(self, keys: Int64Array) -> tuple[BoolArray, RecordBatch]:
        """found (n,) and the records of the found keys, in key order (compressed)."""

    @abstractmethod
    def put(self, keys: Int64Array, records: RecordBatch, existed: BoolArray | None = None) -> None:
        """Insert or overwrite the records of distinct keys. ``existed``: which keys the
        tier holds already, when the caller knows (a tier that would have to read to find
        out, to keep ``len`` exact, may trust it)."""

    @abstractmethod
    def remove(self, keys: Int64Array, present: BoolArray | None = None) -> BoolArray:
        """Remove distinct keys; returns which were present (``present``, when the caller
        knows it, is trusted the same way)."""

    @abstractmethod
    def scan(self, chunk_rows: int) -> Iterator[tuple[Int64Array, RecordBatch]]:
        """All (keys, records), chunk by chunk, in no particular order."""

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """At least rows, capacity, bytes and evictions."""

    def is_empty(self) -> bool:
        """Whether the tier holds no row (``len(self) == 0``; a tier whose exact count costs
        a pass over its rows answers this in O(1))."""
        return len(self) == 0

    def prefetch(self, keys: Int64Array) -> None:  # noqa: B027 (a no-op by default)
        """Start reading the rows of keys (repeats allowed) in the background, so that a
        ``get`` of them soon after finds them read; a hint that changes no result (a no-op
        for a tier whose reads cost nothing to wait for)."""

    def flush(self) -> None:  # noqa: B027 (a no-op by default)
        """Make every row the tier holds reach the bottom of whatever it stacks (a tier that
        is itself a chain of tiers writes its dirty rows down); a no-op for a single tier."""

    def levels(self) -> dict[str, dict[str, Any]]:
        """``stats()`` per storage level, top first, keyed by level name: one level for a
        single tier, one per tier for a tier that stacks several (``Table.stats()["tiers"]``
        shows them all)."""
        return {self.name: self.stats()}

    def to_arrays(self) -> dict[str, Any]:
        """What the tier keeps in memory about its rows and must persist (counts, filters),
        for the database's metadata; the rows themselves are not included."""
        return {}

    def load_arrays(self, arrays: dict[str, Any]) -> None:  # noqa: B027 (a no-op by default)
        """Restore what ``to_arrays`` returned."""


class CacheTier(Tier):
    """The role of a tier on top of a chain (HBM, DRAM): it holds rows resident, operates on
    them in place with fused kernels, and keeps the chain's bookkeeping of each row.

    Rows are named by handles (int64, -1 = none) that ``locate`` and ``insert`` hand out: a
    handle stays valid while ``frees`` is unchanged. Every array crosses the boundary as an
    argument or a result, on the host: a tier never exposes its columns, so the same table
    runs over numpy columns with the cpu kernels or device columns with the gpu kernels. (A
    tier on a CUDA device also takes device ``out`` buffers and gradients, and then leaves
    the rows there: the table's device path, ``evdb.tiers.device_path``.)
    """

    frees: int  # calls that freed rows; a handle taken before is valid while this holds

    # -- rows -----------------------------------------------------------------------------
    @abstractmethod
    def locate(self, keys: Int64Array, out: Int64Array | None = None) -> Int64Array:
        """Row of each key (n,), -1 where absent (expired rows are still located)."""

    @abstractmethod
    def insert(
        self,
        keys: Int64Array,
        records: RecordBatch,
        *,
        dirty: bool = True,
        below_step: Int64Array | None = None,
    ) -> Int64Array:
        """Store records of distinct absent keys; returns their rows. ``below_step``: the
        ``last_step`` of the copy the tier below holds, when it holds one; ``dirty``: whether
        this copy differs from it."""

    @abstractmethod
    def write(self, rows: Int64Array, records: RecordBatch) -> None:
        """Overwrite whole records of rows."""

    @abstractmethod
    def read(self, rows: Int64Array) -> RecordBatch:
        """Whole records of rows (distinct, live)."""

    @abstractmethod
    def assign(
        self, rows: Int64Array, values: Float32Array, step: int, version: int, freeze: bool | None
    ) -> None:
        """Set rows' values (an upsert), stamping ``last_step``, ``version`` and dirty;
        ``freeze`` sets or clears the FROZEN flag (None leaves it)."""

    @abstractmethod
    def remove_rows(self, rows: Int64Array) -> None:
        """Free rows (distinct, live) in this tier only."""

    @abstractmethod
    def keys_of(self, rows: Int64Array) -> Int64Array:
        """The key of each row."""

    @abstractmethod
    def last_steps(self, rows: Int64Array) -> Int64Array:
        """The ``last_step`` of each row (TTL verdicts)."""

    @abstractmethod
    def live_rows(self) -> Int64Array:
        """Every occupied row, expired ones included."""

    # -- reads and the training path ------------------------------------------------------
    @abstractmethod
    def lookup(
        self, keys: Int64Array, min_live_step: int, out: Float32Array, out_rows: Int64Array
    ) -> int:
        """Fused probe, TTL check and gather: ``out[i]`` = the row of ``keys[i]`` where it is
        live, ``out_rows[i]`` its row or -1; returns how many keys missed (their ``out`` rows
        are left for the caller to fill)."""

    @abstractmethod
    def lookup_bags(
        self,
        keys: Int64Array,
        bags: Bags,
        min_live_step: int,
        defaults: tuple[int, int, float, float],
        out: Float32Array,
    ) -> None:
        """Fused probe, gather and combine of bags into ``out`` (B, dim); a key without a
        live row here contributes its default value (``defaults``: the initializer's kernel
        parameters, or a constant)."""

    @abstractmethod
    def pull_rows(
        self, rows: Int64Array, counts: Int64Array, step: int, version: int, out: Float32Array
    ) -> int:
        """A training read of rows (-1 = none): ``freq += counts`` (saturating), ``last_step``,
        ``version``, dirty, pinned, and the values copied into ``out``; returns how many
        rows were found. Pinned rows are no victims until ``unpin_all``."""

    @abstractmethod
    def apply(
        self,
        rows: Int64Array,
        grads: Float32Array,
        positions: Int64Array,
        bounds: Int64Array,
        optimizer: int,
        hyper: Any,
        step: int,
        version: int,
    ) -> tuple[int, int]:
        """Apply an optimizer to rows in place (-1 rows: gradients dropped; frozen rows: read,
        never changed): each row's gradient is the sum of ``grads[positions[bounds[i]:
        bounds[i+1]]]``. Stamps ``last_step``, ``version`` and dirty. Returns (dropped,
        frozen) counts."""

    @abstractmethod
    def live_blocks(
        self, min_live_step: int, block_rows: int
    ) -> Iterator[tuple[Float32Array, Int64Array]]:
        """(values, keys) of the live rows, a block of rows at a time (host arrays; read in
        place where the rows are in host memory)."""

    @abstractmethod
    def doomed(self, min_live_step: int, l2_threshold: float | None) -> tuple[Int64Array, int]:
        """Rows that ``compact`` removes (expired, or live with an L2 norm under the
        threshold), and how many of them are expired."""

    # -- the batch in flight and eviction -------------------------------------------------
    @abstractmethod
    def pin(self, rows: Int64Array) -> None:
        """Protect rows from eviction until ``unpin_all``."""

    @abstractmethod
    def pinned(self, rows: Int64Array) -> BoolArray:
        """Whether each row is pinned."""

    @abstractmethod
    def unpin_all(self) -> None:
        """Release every pin."""

    @abstractmethod
    def n_pinned(self, min_live_step: int) -> int:
        """Pinned rows that are still live (an expired row is gone, pinned or not)."""

    @abstractmethod
    def choose_victims(
        self, step: int, min_live_step: int, protect: Int64Array | None = None
    ) -> tuple[Int64Array, BoolArray]:
        """When over capacity, the lowest-score rows that bring the tier down to its low
        watermark, and which of them have expired; pinned rows are never victims unless
        expired, ``protect`` rows never. Nothing is removed."""

    @abstractmethod
    def count_evictions(self, expired: BoolArray) -> None:
        """Count victims that left (``expired`` per victim)."""

    @abstractmethod
    def eviction_counts(self) -> tuple[int, int]:
        """Rows evicted, and expired rows reclaimed by eviction."""

    @abstractmethod
    def load_eviction_counts(self, counts: tuple[int, int]) -> None:
        """Restore what ``eviction_counts`` returned."""

    # -- the chain's bookkeeping ----------------------------------------------------------
    @abstractmethod
    def dirty_rows(self) -> Int64Array:
        """Live rows changed since they were last written down."""

    @abstractmethod
    def dirty(self, rows: Int64Array) -> BoolArray:
        """Whether each row is dirty."""

    @abstractmethod
    def mark_dirty(self, rows: Int64Array) -> None:
        """Mark rows changed (written into this tier by the tier above)."""

    @abstractmethod
    def copies_below(self, rows: Int64Array) -> tuple[BoolArray, Int64Array]:
        """Whether the tier below holds a copy of each row, and that copy's ``last_step``."""

    @abstractmethod
    def mark_written(self, rows: Int64Array, last_step: Int64Array) -> None:
        """Rows were written down: clean, with a copy below stamped ``last_step``."""

    @abstractmethod
    def live_count(self, min_live_step: int) -> int:
        """Rows live at ``min_live_step``."""

    @abstractmethod
    def shadowed_count(self, min_live_step: int | None = None) -> int:
        """Rows whose copy below this tier also holds (live at ``min_live_step``, if given)."""

    @property
    @abstractmethod
    def index_moving(self) -> bool:
        """Whether a probe changes the tier now (its index is moving into a bigger table):
        then even a read must run alone."""
