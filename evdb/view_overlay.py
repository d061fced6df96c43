"""The overlay of a publication: the rows and tombstones newer than a full snapshot that a
follower holds in memory over it (``evdb.view.TableView`` reads through it).

Why an overlay rather than applying deltas to a writable copy: the RocksDB files stay
immutable and shared by every worker, and a delta is applied by building new arrays off the
request path and swapping one reference, so a read never sees half a delta; a lookup pays one
``searchsorted`` per layer on top of the table's read. The overlay has two layers: a recent
one that each apply merges into, folded into the older one once past an eighth of it (or
``RECENT_ROWS``), so an apply copies the recent rows, not every row changed since the full
(measured: merging a 10,000-row delta into a 214,000-row overlay took 7.6 ms, 3.5 of them
copying the overlay's rows). The merges run in the ``merge_newest`` kernel, which releases the
GIL: the numpy version (a stable sort and gathers) held it, and lookup p99 during applies was
3.7-4.3x idle in ``bench_freshness``.

A follower that serves quantised (``evdb serve ROOT --follow --dtype int8``) holds the rows
quantised as well (``Overlay.empty(dim, bits=8)``): each delta row is quantised row-wise by
the export's kernel as it is applied (its own scale and bias, so it equals that row of an
int8 export), its codes zero-padded to whole 4-byte words and held as float32 words, which
the merge copies bit for bit; ``decode`` dequantises the rows a read needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from evdb._types import BoolArray, Float32Array, Int64Array
from evdb.errors import InvalidArgumentError
from evdb.kernels import backend
from evdb.tiers.frozen import row_stride

if TYPE_CHECKING:
    from evdb.publish import Delta

__all__ = ["RECENT_ROWS", "Overlay", "Rows", "code_words"]

_kernels = backend("cpu")

RECENT_ROWS = 65536  # the recent layer folds into the older past this (or an eighth of it)


def code_words(dim: int, bits: int) -> int:
    """Columns (float32 words) of an overlay row: dim, or a quantised row's bytes in words."""
    if bits == 0:
        return dim
    dtype = {8: "int8", 4: "int4"}[bits]
    return -(-row_stride(dim, dtype) // 4)


@dataclass(frozen=True)
class Rows:
    """One sorted set of rows over a table: keys (m,) int64 sorted and distinct, values
    (m, dim) float32, last_step (m,) int64, removed (m,) bool (a tombstone: the key has no
    row, whatever the table holds)."""

    keys: Int64Array
    values: Float32Array
    last_step: Int64Array
    removed: BoolArray

    @classmethod
    def empty(cls, dim: int) -> Rows:
        z = np.empty(0, dtype=np.int64)
        return cls(z, np.empty((0, dim), np.float32), z, np.empty(0, dtype=bool))

    @classmethod
    def of_delta(cls, delta: Delta) -> Rows:
        """A delta's rows and tombstones (disjoint, each sorted) as one sorted set."""
        dim, r = delta.values.shape[1], delta.removed.shape[0]
        rows = cls(delta.keys, delta.values, delta.last_step, np.zeros(delta.keys.shape[0], bool))
        tombstones = cls(
            delta.removed,
            np.zeros((r, dim), np.float32),
            np.zeros(r, np.int64),
            np.ones(r, dtype=bool),
        )
        return rows.under(tombstones)

    @property
    def n_rows(self) -> int:
        return int(self.keys.shape[0])

    def under(self, newer: Rows) -> Rows:
        """The rows of both, sorted by key, newer's where both have a key (one linear pass
        of the ``merge_newest`` kernel, which releases the GIL)."""
        if newer.n_rows == 0:
            return self
        if self.n_rows == 0:
            return newer
        n, dim = self.n_rows + newer.n_rows, self.values.shape[1]
        out = Rows(
            np.empty(n, np.int64), np.empty((n, dim), np.float32), np.empty(n, np.int64),
            np.empty(n, dtype=bool),
        )  # fmt: skip
        c = np.ascontiguousarray
        m = _kernels.merge_newest(
            c(self.keys), c(self.values), c(self.last_step), c(self.removed),
            c(newer.keys), c(newer.values), c(newer.last_step), c(newer.removed),
            out.keys, out.values, out.last_step, out.removed,
        )  # fmt: skip
        return Rows(out.keys[:m], out.values[:m], out.last_step[:m], out.removed[:m])

    def find(self, keys: Int64Array) -> tuple[Int64Array, Int64Array]:
        """(positions in keys, their rows here) of the keys this set holds (row or tombstone)."""
        if self.n_rows == 0:
            z = np.empty(0, np.int64)
            return z, z
        at = np.searchsorted(self.keys, keys).clip(max=self.n_rows - 1)
        hit = np.flatnonzero(self.keys[at] == keys)
        return hit, at[hit]

    def holds(self, keys: Int64Array) -> BoolArray:
        """(n,) bool: which keys this set holds (a row or a tombstone)."""
        held = np.zeros(keys.shape[0], dtype=bool)
        held[self.find(keys)[0]] = True
        return held

    def live(self, min_live: int, at: Int64Array | None = None) -> BoolArray:
        """(m,) bool: which entries are rows live at ``min_live`` (not tombstones); with
        ``at``, (len(at),) bool of those entries only (a lookup's hits: O(hits), not O(m))."""
        if at is None:
            return ~self.removed & (self.last_step >= min_live)
        return ~self.removed[at] & (self.last_step[at] >= min_live)


@dataclass(frozen=True)
class Overlay:
    """One table's rows changed since a full snapshot, in two layers (the recent one over
    the older; see the module docstring). Immutable: :meth:`applied` returns a new one.
    ``bits`` 0: rows held as float32; 8 or 4: quantised, int8 or int4 codes."""

    older: Rows
    recent: Rows
    dim: int
    bits: int = 0
    _rows: list[Rows] = field(default_factory=list, init=False, repr=False, compare=False)

    @classmethod
    def empty(cls, dim: int, *, bits: int = 0) -> Overlay:
        if bits not in (0, 8, 4):
            raise InvalidArgumentError(f"bits must be 0 (float32), 8 or 4, got {bits!r}")
        e = Rows.empty(code_words(dim, bits))
        return cls(e, e, dim, bits)

    @property
    def n_rows(self) -> int:
        """Rows and tombstones held, both layers."""
        return self.older.n_rows + self.recent.n_rows

    @property
    def layers(self) -> tuple[Rows, ...]:
        """The non-empty layers, older first (a later layer wins), as held (quantised ones'
        values are codes: read them through :meth:`decode`)."""
        return tuple(r for r in (self.older, self.recent) if r.n_rows)

    @property
    def merged(self) -> Rows:
        """Both layers merged into one, as held, built on first use and kept."""
        if not self._rows:  # two threads may both build it: the same rows either way
            self._rows.append(self.older.under(self.recent))
        return self._rows[0]

    @property
    def rows(self) -> Rows:
        """Both layers merged into one with float32 values (for scans): :attr:`merged`;
        quantised, its rows dequantised, built on each use (not kept: no float32 copy of a
        quantised overlay outlives the scan that asked)."""
        merged = self.merged
        if self.bits == 0:
            return merged
        values = self.decode(merged, np.arange(merged.n_rows, dtype=np.int64))
        return Rows(merged.keys, values, merged.last_step, merged.removed)

    def decode(self, rows: Rows, at: Int64Array) -> Float32Array:
        """(len(at), dim) float32: the values of the entries ``at`` of ``rows`` (one of this
        overlay's), dequantised where they are codes (tombstones read zeros)."""
        if self.bits == 0:
            out: Float32Array = rows.values[at]
            return out
        out = np.empty((at.shape[0], self.dim), np.float32)
        codes = rows.values.view(np.uint8)
        _kernels.dequantize_rows(codes, self.bits, np.ascontiguousarray(at, np.int64), out)
        return out

    def _encoded(self, delta: Delta) -> Rows:
        """A delta's rows as this overlay holds them (quantised row-wise if it quantises)."""
        if self.bits == 0:
            return Rows.of_delta(delta)
        m = delta.keys.shape[0]
        codes = np.zeros((m, 4 * code_words(self.dim, self.bits)), np.uint8)
        _kernels.quantize_rows(np.ascontiguousarray(delta.values, np.float32), self.bits, codes)
        return Rows.of_delta(replace(delta, values=codes.view(np.float32)))

    def applied(self, deltas: Sequence[Delta]) -> Overlay:
        """This overlay with deltas applied in order (a later entry of a key wins): merged
        into the recent layer, which folds into the older once past an eighth of it or
        ``RECENT_ROWS``."""
        if not deltas:
            return self
        newer: Rows | None = None
        for d in deltas:
            one = self._encoded(d)
            newer = one if newer is None else newer.under(one)
        assert newer is not None
        recent = self.recent.under(newer)
        if recent.n_rows > max(self.older.n_rows // 8, RECENT_ROWS):
            empty = Rows.empty(recent.values.shape[1])
            return Overlay(self.older.under(recent), empty, self.dim, self.bits)
        return Overlay(self.older, recent, self.dim, self.bits)
