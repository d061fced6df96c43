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

from evdb._types import BoolArray, Int64Array
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
