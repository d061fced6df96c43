"""The RocksDB tier: the backing store under DRAM, one column family per table.

The rows of a table live in their own column family of the database's ``RocksStore``
(``evdb.tiers.store``), named ``t.<table>``. RocksDB's block compression is per column family
(none by default: trained float32 rows do not compress; see ``DiskConfig``). Keys are 8
bytes, big-endian, with the sign bit flipped, so that RocksDB's byte order is numeric order
(scans come back sorted, ranges are key ranges). Values are the canonical record of
``evdb.records`` (or the same layout with float16 values, when a table asks for it),
converted a batch at a time with numpy views.
"""

from __future__ import annotations

import collections
import itertools
import operator
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from typing import Any, Literal

import numpy as np
import rocksdict

from evdb._types import BoolArray, Int64Array
from evdb.errors import CorruptDataError
from evdb.records import BFLOAT16, RecordBatch, record_dtype
from evdb.tiers.base import Tier
from evdb.tiers.keyfilter import KeyFilter
from evdb.tiers.store import Compression, RocksStore, rocks_error

__all__ = ["RocksStrings", "RocksTier", "decode_keys", "encode_keys"]

DiskDtype = Literal["float32", "float16", "bfloat16"]

_SIGN = np.uint64(1 << 63)

_F16_MAX = float(np.finfo(np.float16).max)
# record_dtype's value type per disk dtype (bfloat16: bit patterns, a half-precision table's rows)
_VALUE = {"float32": "<f4", "float16": "<f2", "bfloat16": BFLOAT16}


def encode_keys(keys: Int64Array) -> list[bytes]:
    """8-byte keys whose byte order is the keys' numeric order."""
    flipped = np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64) ^ _SIGN
    return flipped.astype(">u8").view("V8").tolist()  # type: ignore[no-any-return]


def decode_keys(blob: bytes) -> Int64Array:
    """The inverse of ``encode_keys`` over the concatenated key bytes."""
    return (np.frombuffer(blob, dtype=">u8").astype(np.uint64) ^ _SIGN).view(np.int64)


def disk_dtype(
    dim: int, n_slots: int, dtype: DiskDtype, slot_dtype: DiskDtype = "float32"
) -> np.dtype:
    """The record as stored: the canonical layout, with float16 or bfloat16 values (and
    slots: a table's ``slot_dtype``) if asked."""
    return record_dtype(dim, n_slots, _VALUE[dtype], _VALUE[slot_dtype])


class RocksStrings:
    """The original string of each key of a ``keep_strings`` table, in its own column family
    (``s.<table>``): UTF-8 bytes under the same 8-byte keys as the rows."""

    def __init__(self, store: RocksStore, column_family: str) -> None:
        self.store = store
        self.column_family = column_family
        store.column_family(column_family, "none")

    @property
    def cf(self) -> rocksdict.Rdict:
        """The column family's handle, asked for at each use (a recovery replaces it)."""
        return self.store.column_family(self.column_family, "none")

    def get(self, keys: Int64Array) -> list[str | None]:
        if keys.shape[0] == 0:
            return []
        encoded: list[Any] = encode_keys(keys)
        got: list[Any] = self.cf.get(encoded) or []
        return [None if b is None else bytes(b).decode() for b in got]

    def put(self, keys: Int64Array, strings: list[str]) -> None:
        self.store.write_rows(self.column_family, encode_keys(keys), [s.encode() for s in strings])

    def remove(self, keys: Int64Array) -> None:
        self.store.write_rows(self.column_family, encode_keys(keys), None)

    def scan_keys(self, chunk_rows: int) -> Iterator[Int64Array]:
        """Every key that has a string, in key order, a chunk at a time."""
        return scan_keys(lambda: self.cf, chunk_rows)


def scan_keys(cf: Callable[[], rocksdict.Rdict], chunk_rows: int) -> Iterator[Int64Array]:
    """The keys of a column family (whose handle ``cf()`` gives), in key order, a chunk at a
    time, without their values; a fresh handle and iterator per chunk (an open one would
    pin the database)."""
    start: bytes | None = None
    while True:
        it = cf().keys(from_key=start)
        chunk: list[Any] = list(itertools.islice(it, chunk_rows + (start is not None)))
        del it
        if start is not None and chunk and chunk[0] == start:
            chunk = chunk[1:]
        else:
            chunk = chunk[:chunk_rows]
        if not chunk:
            return
        start = chunk[-1]
        yield decode_keys(b"".join(chunk))


# A multi-get of at least this many keys is split in two halves read at once (see
# RocksTier._multi_get): a round trip to the reader thread measured 12 us, a key read 3-10.
# Not below: the spilling run's multi-gets (~340 keys) split cost 5-15% more RocksDB CPU and
# 11-23% longer steps (the reader competes with the step's own threads; bench/README).
SPLIT_KEYS = 4096
_MANY_CORES = len(os.sched_getaffinity(0)) > 1 if hasattr(os, "sched_getaffinity") else True

_UNREAD = object()  # a key the read-ahead did not read (None: read, and not stored)


class _ReadAhead:
    """The rows ``RocksTier.prefetch`` read: record bytes (None: not stored) by encoded key.

    The read runs on the store's reader thread. A put or remove of a key makes its read-ahead
    copy stale; until the read is collected (``RocksTier._read_ahead``) the written keys are
    logged and dropped from it then, because the read may have seen either version.
    """

    def __init__(self, future: Future[Any], keys: list[bytes]) -> None:
        self.future = future
        self.keys = keys
        self.rows: dict[bytes, Any] | None = None
        self.written: list[list[bytes]] = []

    def forget(self, keys: list[bytes]) -> None:
        if self.rows is None:
            self.written.append(keys)
        else:
            collections.deque(map(self.rows.pop, keys, itertools.repeat(None)), maxlen=0)


class RocksTier(Tier):
    """One table's rows in its column family. Satisfies the ``Tier`` contract.

    ``len`` is exact: the tier counts its rows, and callers that already know whether keys
    are stored (the chain keeps a bit per cached row) say so, sparing a read per write.

    ``prefetch`` reads a coming batch's rows on the store's reader thread (as FBGEMM's SSD
    table and HugeCTR's parameter server read the next batch's misses while the current one
    trains); the ``get`` after it takes what was read ahead and reads only the rest. Only
    reads move off the caller's thread, so the crash contract (a flush is the cut) is the
    same: a read ahead never writes.
    """

    name = "rocksdb"

    def __init__(
        self,
        store: RocksStore,
        column_family: str,
        dim: int,
        n_slots: int,
        *,
        compression: Compression = "none",
        dtype: DiskDtype = "float32",
        slot_dtype: DiskDtype = "float32",
    ) -> None:
        self.store = store
        self.column_family = column_family
        self.compression = compression
        store.column_family(column_family, compression)
        self.dim = dim
        self.n_slots = n_slots
        self.dtype = dtype
        self.slot_dtype = slot_dtype  # a half-precision table's own slots: stored as they are
        self._record = disk_dtype(dim, n_slots, dtype, slot_dtype)
        self._rows = 0
        self.filter = KeyFilter()  # keys ever written: a miss it rules out costs no read
        self._ahead: _ReadAhead | None = None
        self.counters = {
            "hits": 0,
            "misses": 0,
            "filtered": 0,
            "puts": 0,
            "removes": 0,
            "f16_overflow": 0,
            "read_ahead": 0,  # keys prefetch read
            "read_ahead_used": 0,  # keys a get took from a read ahead instead of reading
        }

    @property
    def cf(self) -> rocksdict.Rdict:
        """The column family's handle, asked for at each use (a recovery replaces it)."""
        return self.store.column_family(self.column_family, self.compression)

    # -- capabilities ---------------------------------------------------------------------
    @property
    def persistent(self) -> bool:
        return True

    @property
    def device(self) -> str:
        return "cpu"

    @property
    def capacity_rows(self) -> int | None:
        return None

    def __len__(self) -> int:
        return self._rows

    # -- conversion -----------------------------------------------------------------------
    def _pack(self, records: RecordBatch) -> list[bytes]:
        if self.dtype == "float16":
            # A value beyond float16's range would be stored as inf: count it, never hide it.
            big = np.abs(records.values) > _F16_MAX
            self.counters["f16_overflow"] += int(np.count_nonzero(big.any(axis=1)))
        out = records.pack(_VALUE[self.dtype], _VALUE[self.slot_dtype])
        return out.view(f"V{self._record.itemsize}").tolist()  # type: ignore[no-any-return]

    def _unpack(self, blob: bytes | np.ndarray) -> RecordBatch:
        where = f"{self.store.path}, column family {self.column_family!r}: "
        return RecordBatch.unpack(
            blob, self.dim, self.n_slots, _VALUE[self.dtype], where, _VALUE[self.slot_dtype]
        )

    # -- Tier contract --------------------------------------------------------------------
    def get(self, keys: Int64Array) -> tuple[BoolArray, RecordBatch]:
        """Rows of keys (repeats allowed): which were found, and their records in input order.

        Keys the filter rules out are not read; the rest are read in key order (RocksDB then
        meets each block once) by one multi-get, and the values found are decoded in one
        vectorised pass: joined into one buffer, viewed as records and scattered into input
        order. The only per-row work left in Python is what the binding does itself."""
        n = keys.shape[0]
        found = np.zeros(n, dtype=bool)
        maybe = np.flatnonzero(self.filter.may_contain(keys))
        self.counters["filtered"] += n - maybe.shape[0]
        if maybe.shape[0] == 0:
            self.counters["misses"] += n
            return found, self._unpack(b"")
        asked = keys[maybe]
        in_order = bool((asked[1:] >= asked[:-1]).all())  # (a lookup's keys come sorted)
        if not in_order:
            maybe = maybe[np.argsort(asked, kind="stable")]  # key order: blocks read once
            asked = keys[maybe]
        got = self._read(encode_keys(asked))
        records, hit = self._decode(got)
        at = maybe if hit is None else maybe[hit]
        found[at] = True
        hits = at.shape[0]
        self.counters["hits"] += hits
        self.counters["misses"] += n - hits
        if not in_order:
            # input order: a found key's record goes to the count of found keys before it
            # (scattered as rows of bytes: numpy copies those faster than structured records)
            into = np.cumsum(found)[at] - 1
            ordered = np.empty((hits, self._record.itemsize), dtype=np.uint8)
            ordered[into] = records
            records = ordered
        return found, self._unpack(records.view(self._record).reshape(hits))

    def _read(self, encoded: list[Any]) -> list[Any]:
        """The values of encoded keys (sorted), None where not stored: what the read ahead
        holds, the rest from one multi-get."""
        ahead = self._read_ahead()
        if ahead is None:
            return self._multi_get(encoded)
        got = list(map(ahead.get, encoded, itertools.repeat(_UNREAD)))
        unread: list[int] = []
        if _UNREAD in got:
            is_unread = map(operator.is_, got, itertools.repeat(_UNREAD))
            unread = np.flatnonzero(np.fromiter(is_unread, bool, len(got))).tolist()
        self.counters["read_ahead_used"] += len(encoded) - len(unread)
        if unread:
            rest = self._multi_get(list(map(encoded.__getitem__, unread)))
            collections.deque(map(got.__setitem__, unread, rest), maxlen=0)
        return got

    def _multi_get(self, encoded: list[Any]) -> list[Any]:
        """The values of encoded keys (sorted), with the store's read options: one multi-get,
        or, for ``SPLIT_KEYS`` keys or more on a machine of several cores, two over the two
        halves of the key range at once, the second on the store's reader thread (rocksdict
        lets go of the GIL while RocksDB reads). A second half the reader has not started
        (it is busy) is read here after the first, so no read waits behind another."""
        cf, opts = self.cf, self.store.read_options
        try:
            if len(encoded) < SPLIT_KEYS or not _MANY_CORES:
                got: list[Any] = cf.get(encoded, read_opt=opts) or []
                return got
            half = len(encoded) // 2
            rest = encoded[half:]
            later = self.store.read_later(lambda: cf.get(rest, read_opt=opts))
            try:
                got = cf.get(encoded[:half], read_opt=opts) or []
            finally:
                if not later.cancel():
                    wait([later])  # (its error, if any, is the one the caller sees)
            got += (cf.get(rest, read_opt=opts) if later.cancelled() else later.result()) or []
            return got
        except Exception as e:  # rocksdict raises RocksDB's status as a plain Exception
            raise rocks_error(self.store.path, f"read of {self.column_family!r}", e) from e

    def _decode(self, got: list[Any]) -> tuple[np.ndarray, BoolArray | None]:
        """The records among values ``got`` (None: not stored), one row of bytes each in one
        buffer, and which were found (None: all of them)."""
        hit: BoolArray | None = None
        expect = len(got)
        if None in got:
            hit = np.fromiter(map(operator.is_not, got, itertools.repeat(None)), bool, len(got))
            expect = int(np.count_nonzero(hit))
        blob = b"".join(got if hit is None else itertools.compress(got, hit.tolist()))
        size = self._record.itemsize
        if len(blob) != expect * size:
            where = f"{self.store.path}, column family {self.column_family!r}"
            raise CorruptDataError(
                f"{where}: {expect} records read are {len(blob)} bytes, expected "
                f"{expect} x {size} (dim={self.dim}, slots={self.n_slots}, {self.dtype}, "
                f"slots {self.slot_dtype})"
            )
        return np.frombuffer(blob, dtype=np.uint8).reshape(expect, size), hit

    def exists(self, keys: Int64Array) -> BoolArray:
        found, _ = self.get(keys)
        return found

    def prefetch(self, keys: Int64Array) -> None:
        """Read the rows of keys (repeats allowed) on the reader thread, for the next
        ``get``; keys the filter rules out are not read. It replaces the read ahead before."""
        self._ahead = None
        maybe = keys[self.filter.may_contain(keys)]
        if maybe.shape[0] == 0:
            return
        encoded: list[Any] = encode_keys(np.unique(maybe))  # key order: blocks read once
        cf, opts = self.cf, self.store.read_options
        self._ahead = _ReadAhead(
            self.store.read_later(lambda: cf.get(encoded, read_opt=opts)), encoded
        )
        self.counters["read_ahead"] += len(encoded)

    def _read_ahead(self) -> dict[bytes, Any] | None:
        """The rows the last ``prefetch`` read, less those written since (waiting for the
        read if it is still running); None when there are none. A read that failed is
        dropped: the caller reads the keys again, and meets the error itself if it stays."""
        ahead = self._ahead
        if ahead is None:
            return None
        if ahead.rows is None:
            try:
                got = ahead.future.result()
            except Exception:  # rocksdict raises plain Exception for I/O errors
                self._ahead = None
                return None
            ahead.rows = dict(zip(ahead.keys, got, strict=True))
            for written in ahead.written:
                ahead.forget(written)
            ahead.written.clear()
        return ahead.rows

    def put(self, keys: Int64Array, records: RecordBatch, existed: BoolArray | None = None) -> None:
        """Insert or overwrite rows of distinct keys; ``existed`` (which keys are already
        stored), when the caller knows it, saves a read."""
        if keys.shape[0] == 0:
            return
        if existed is None:
            existed = self.exists(keys)
        encoded = encode_keys(keys)
        if self._ahead is not None:
            self._ahead.forget(encoded)
        self.store.write_rows(self.column_family, encoded, self._pack(records))
        self.filter.add(keys[~existed])
        self._rows += int(keys.shape[0] - np.count_nonzero(existed))
        self.counters["puts"] += keys.shape[0]

    def remove(self, keys: Int64Array, present: BoolArray | None = None) -> BoolArray:
        """Delete distinct keys; returns which were present (``present``, if the caller
        knows it, saves a read)."""
        if present is None:
            present = self.exists(keys)
        gone = keys[present]
        if gone.shape[0]:
            encoded = encode_keys(gone)
            if self._ahead is not None:
                self._ahead.forget(encoded)
            self.store.write_rows(self.column_family, encoded, None)
            self._rows -= int(gone.shape[0])
            self.counters["removes"] += int(gone.shape[0])
        return present

    def scan_keys(self, chunk_rows: int) -> Iterator[Int64Array]:
        """The stored keys in key order, without reading the records."""
        return scan_keys(lambda: self.cf, chunk_rows)

    def scan(self, chunk_rows: int) -> Iterator[tuple[Int64Array, RecordBatch]]:
        """Rows in key order, a chunk at a time. Each chunk is read by a fresh iterator that
        starts after the last key yielded (an open iterator would pin the database, and a
        caller may remove the rows of a chunk before asking for the next)."""
        start: bytes | None = None
        while True:
            items = self.cf.items(from_key=start)
            chunk = list(itertools.islice(items, chunk_rows + (start is not None)))
            del items
            if start is not None and chunk and chunk[0][0] == start:
                chunk = chunk[1:]
            else:
                chunk = chunk[:chunk_rows]
            if not chunk:
                return
            keys, values = zip(*chunk, strict=True)
            start = keys[-1]
            yield decode_keys(b"".join(keys)), self._unpack(b"".join(values))

    def to_arrays(self) -> dict[str, Any]:
        arrays = {f"filter.{k}": v for k, v in self.filter.to_arrays().items()}
        return {"rows": np.array([self._rows], dtype=np.int64), **arrays}

    def load_arrays(self, arrays: dict[str, Any]) -> None:
        self._ahead = None
        self._rows = int(arrays["rows"][0])
        prefix = "filter."
        self.filter.load_arrays(
            {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
        )

    def stats(self) -> dict[str, Any]:
        sst = self.cf.property_int_value("rocksdb.total-sst-files-size") or 0
        mem = self.cf.property_int_value("rocksdb.cur-size-all-mem-tables") or 0
        return {
            "rows": self._rows,
            "capacity": None,
            "evictions": 0,
            "bytes": int(sst + mem),
            "filter_bytes": self.filter.nbytes,
            "dtype": self.dtype,
            "slot_dtype": self.slot_dtype,
            # a record as written, by part (RocksDB's own overhead and compression aside): the
            # key and the key filter are the index
            "bytes_per_row_by_component": {
                "values": self._record["value"].itemsize,
                "slots": self._record["slots"].itemsize,
                "metadata": self._record.itemsize
                - self._record["value"].itemsize
                - self._record["slots"].itemsize,
                "index": 8 + self.filter.nbytes / max(self._rows, 1),
            },
            **self.counters,
        }
