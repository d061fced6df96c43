"""The whole-table reads of ``Table``: counts, scans of every row, neighbours.

``TableScans`` sits between the point reads (``evdb.table_reads.TableReads``) and the writes
(``evdb.table.Table``). A scan reads a chunk at a time, each chunk under the database's lock
held shared and never across a ``yield`` (``evdb.locking.locked_chunks``), from the top tier
and then the rows only below it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from evdb._types import Float32Array, Int64Array
from evdb.errors import InvalidArgumentError
from evdb.locking import locked_chunks, reading
from evdb.records import RecordBatch
from evdb.table_reads import TableReads

__all__ = ["TableScans"]

# Top-tier rows scored per matmul by neighbours: 8,192 rows of dim 64 are 2 MiB, so the second
# pass a block needs (row norms for cosine and l2) still finds it in cache.
_BLOCK_ROWS = 8192
# Rows only on disk, read a chunk of this many at a time: the RocksDB tier's scan holds about
# 1 KB of Python objects per row of a chunk while it decodes it (16,384 rows: 18 MB).
_DISK_CHUNK_ROWS = 16384


class TableScans(TableReads):
    """Reads of the whole table (see ``Table``)."""

    def __len__(self) -> int:
        """Live rows: expired rows do not count, even before ``compact()``."""
        return self.count()

    @reading
    def count(self, *, step: int | None = None) -> int:
        """Live rows at ``step`` (default ``db.step``): ``len(table)`` at another step. Exact
        at any step from ``db.step`` on (a view of a publication counts at its own); at an
        earlier one, rows below the top tier that had expired by ``db.step``'s last write
        count as one group, live if that group's step is."""
        self._db.check_open()
        return self._chain.live_rows(self._min_live(step))

    @reading
    def stored_rows(self) -> int:
        """Rows the table stores, expired ones included (what ``records`` yields): cached
        rows, plus the rows below that the cache does not hold."""
        self._db.check_open()
        return self._chain.stored_rows()

    def records(
        self,
        chunk_rows: int = 65536,
        *,
        live_only: bool = False,
        since_version: int | None = None,
        strict: bool = True,
        step: int | None = None,
    ) -> Iterator[tuple[Int64Array, RecordBatch]]:
        """Whole records (values, slots, ``freq``, ``last_step``, ``version``, flags) as
        ``(keys, records)`` chunks, each row once, from whichever tier holds it: what
        checkpoints, exports, publications, samples and resharding read.

        ``live_only``: only rows live at ``step`` (default ``db.step``); otherwise expired
        rows too. ``since_version``: only rows changed after that table version (an
        incremental checkpoint). Each chunk is read under the database's lock (shared, or
        the caller's exclusive hold), never across a ``yield``; ``strict`` as in ``items``
        (False: a sample that goes on past writes between chunks). Empty chunks are skipped.
        A generator: it checks ``chunk_rows`` at the first ``next``.
        """
        if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
            raise InvalidArgumentError(f"chunk_rows must be an int >= 1, got {chunk_rows!r}")
        min_live = self._min_live(step)
        what = f"table {self.name!r}"
        chunks = self._chain.scan(chunk_rows)  # a generator: it reads nothing until next()
        for keys, recs in locked_chunks(
            self, chunks, self._db.check_open, strict=strict, what=what
        ):
            keep = recs.last_step >= min_live if live_only else None
            if since_version is not None:
                newer = recs.version > np.uint64(since_version)
                keep = newer if keep is None else keep & newer
            if keep is not None and not keep.all():
                keys, recs = keys[keep], recs.take(keep)
            if keys.shape[0]:
                yield keys, recs

    def items(self, chunk_rows: int = 65536) -> Iterator[tuple[Int64Array, Float32Array]]:
        """Iterate ``(keys (m,) int64, values (m, dim) float32)`` chunks over live rows.

        Each chunk is read under the database's lock (shared), which is not held between
        chunks; a write to the database between two chunks (from any thread) makes the next
        one raise ``ConcurrentModificationError`` (the scan could miss or repeat rows):
        iterate again. A thread that holds the database's lock exclusive (a checkpoint) sees
        its own writes.
        """
        for keys, records in self.records(chunk_rows, live_only=True):
            yield keys, records.values

    def live_values(self, *, step: int | None = None) -> Iterator[tuple[Float32Array, Int64Array]]:
        """``(values (m, dim) float32, keys (m,) int64)`` of every live row (at ``step``), a
        block at a time: the top tier's rows (read in place where they are in host memory),
        then the rows only below. Read-only views, valid until the next block; the table must
        not change meanwhile (``neighbors`` holds the lock around the whole pass)."""
        self._db.check_open()
        min_live = self._min_live(step)
        yield from self._top.live_blocks(min_live, _BLOCK_ROWS)
        for keys, records in self._chain.scan_below(_DISK_CHUNK_ROWS):
            live = records.last_step >= min_live
            if live.all():
                yield records.values, keys
            elif live.any():
                yield records.values[live], keys[live]

    @reading
    def neighbors(
        self,
        query: Any,
        k: int = 10,
        metric: str = "cosine",
        *,
        as_strings: bool = False,
        step: int | None = None,
    ) -> tuple[Any, Float32Array]:
        """Exact top-k nearest neighbours of a key or a vector among the live rows.

        Parameters
        ----------
        query : int or str key, or (dim,) float array-like
            A key (its row, or its default value without one; the key itself is left out of
            the answer, as gensim's ``most_similar`` leaves out the word), or a vector.
        k : int
            How many neighbours (fewer when the table has fewer live rows).
        metric : "cosine" | "dot" | "l2"
            Cosine similarity (a row of norm 0 scores 0), dot product, or L2 distance.
        as_strings : bool
            Return the keys' original strings (a table with ``keep_strings=True``).
        step : int, optional
            Judge the TTL at this step instead of ``db.step``.

        Returns
        -------
        keys : (m,) int64, or a list of str (None where unknown) with ``as_strings``
        scores : (m,) float32
            Nearest first: highest similarity, or lowest distance for l2; ties by key.

        Every live row is scored, streamed through the tiers a chunk at a time (a table
        larger than memory works), one matmul per chunk; see ``evdb.neighbors``.
        """
        from evdb.neighbors import neighbors  # a leaf module: imported where it is used

        return neighbors(self, query, k, metric, as_strings, step)

    @reading
    def checkpoint_info(self) -> dict[str, Any]:
        """What a checkpoint manifest records of the table (after a flush): the uid of this
        incarnation, its version and its live rows."""
        return {"uid": self.meta.uid, "version": self.meta.version, "rows": len(self)}
