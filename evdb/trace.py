"""Key traces: the keys a table is asked for, sampled by key hash, for ``evdb size``.

A ``KeyRecorder`` keeps every access of a fixed fraction of the key space (spatial sampling,
SHARDS: a key is kept or dropped by its salted hash, so a kept key's reuse pattern is whole)
and writes them, batch by batch with their operation and step, to one chunked file. A trace
can also come from the user's own logs (``read_key_log``: an npy, npz or parquet column of
keys, with optional steps: ``evdb.sizing_logs``), sampled the same way as it is read.

File format (little-endian; version 2, which adds ``min_keys`` (and, optional, ``keep_rate``)
to version 1's header)::

    "EVDBTRC1" | u32 header_len | header (UTF-8 JSON) | u32 crc32(header)
    chunk*:  "CHNK" | u32 n_batches | u64 n_keys | u32 crc32(payload) | payload
             payload = op u8[b] | step i64[b] | length i64[b] | seen i64[b]
                       | counted i64[b] | keys i64[n]
    end:     "END!" | u64 batches | u64 keys | u64 seen | u32 crc32(those 24 bytes)

The header names the table, the digest of its configuration (and the configuration itself,
so ``evdb size`` can simulate it without the database), the sampling rate and seed, and
``min_keys``: the rate is raised while fewer keys than that were kept (fixed-size SHARDS,
``evdb.trace_sample``; the reader drops the keys kept before it fell) but never below
``keep_rate`` where that is set. ``seen``
is each batch's key count before sampling, ``counted`` the accesses the table's hit and miss
counters count for it (a pull's distinct keys, a lookup's positions; -1 if unknown). A batch's
kept keys are one run of ``keys``; every call is a batch, also one that kept no key (its
counts still weigh in the estimates). The end record is written by ``close``: a file without
it (a crash, a copy cut short) is refused unless the caller accepts its complete chunks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import threading
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb._types import Int64Array
from evdb.errors import CorruptDataError, InvalidArgumentError
from evdb.sizing_kernels import (
    SPARSE_THRESHOLD,
    sample_hashed_into,
    sample_into,
    sample_sparse_into,
    sample_threshold,
)
from evdb.trace_format import (
    CHUNK,
    CHUNK_HEAD,
    DEFAULT_MIN_KEYS,
    MAGIC,
    OPS,
    READS,
    ChunkWriter,
    Trace,
    TraceHeader,
    config_digest,
    op_code,
    parse_rate,
    parse_seed,
    salt_of,
)
from evdb.trace_sample import FULL, SmallestHashes, final_threshold

if TYPE_CHECKING:
    from evdb.config import TableConfig
    from evdb.table import Table

__all__ = [
    "DEFAULT_MIN_KEYS",
    "MAGIC",
    "OPS",
    "KeyRecorder",
    "Trace",
    "TraceHeader",
    "config_digest",
    "op_code",
    "parse_rate",
    "parse_seed",
    "read_trace",
    "salt_of",
]

_END = b"END!"
_END_BODY = struct.Struct("<QQQ")
_U32 = struct.Struct("<I")
_CHUNK_KEYS = 1 << 20  # kept keys buffered before a chunk is written (8 MiB)
_CHUNK_BATCHES = 1 << 16
PROBE_EVERY = 64  # min_keys: most calls between two probes of the smallest hashes
# for_table keeps enough keys that the table's own cache size gets a miniature of this many
# rows (evdb.sizing.MINIATURE_ROWS, what larger sizes get). What spreads a size's answer is
# the share of the keys at the cache's edge the sample kept: at 10M Zipf(1.1) accesses, a
# 5,000-row table's 1,000-row miniatures (rate 0.2) ranged -1.36 to +0.30 points over seven
# hash seeds (seed 2 kept 4.7% more of the 5,000 hottest keys than its rate; a miniature
# sized by that share was -0.49), 2,000-row ones (rate 0.4) -0.63 to +0.15.
CURRENT_SIZE_ROWS = 2048


class KeyRecorder:
    """Records the keys of a table's pulls and lookups, sampled by key hash, to a trace file.

    Parameters
    ----------
    path : str or PathLike
        The trace file; refused if it exists, unless ``overwrite``.
    table : str
        The table's name.
    config : TableConfig or its ``to_dict()``, optional
        The table's configuration, kept in the header (``evdb size`` simulates it).
    rate : float
        Fraction of the key space kept, in (0, 1]; 0.01 by default.
    min_keys : int
        Keep at least this many distinct keys (32,768 by default; 0: exactly ``rate``): the
        rate starts at 1 and falls as new keys come, down to ``rate`` (fixed-size SHARDS,
        ``evdb.trace_sample``). A small key space is then recorded whole, and a large one
        at ``rate``, with enough keys between for a small cache's miniature.
    seed : int
        Salt of the key hash (two recorders with one seed keep the same keys).
    keep_rate : float, optional
        Never keep less than this fraction, above ``rate`` (``for_table`` sets it), while
        ``rate`` stays the floor ``evdb size`` may subsample larger sizes down to.

    Examples
    --------
    >>> import os, tempfile, numpy as np, evdb
    >>> from evdb.trace import KeyRecorder, read_trace
    >>> d = tempfile.mkdtemp()
    >>> with evdb.open(os.path.join(d, "db")) as db:
    ...     t = db.create_table("item", dim=4)
    ...     with KeyRecorder.for_table(t, os.path.join(d, "item.trace"), rate=1.0) as rec:
    ...         keys = np.array([7, 3, 7], dtype=np.int64)
    ...         pulled = t.pull(keys)  # with a recorder attached, Table.pull records:
    ...         rec.record("pull", keys, db.step, counted=pulled.keys.shape[0])
    >>> tr = read_trace(os.path.join(d, "item.trace"), table=t)
    >>> tr.keys.tolist(), tr.steps.tolist(), tr.seen.tolist(), tr.counted.tolist()
    ([7, 3, 7], [0], [3], [2])
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        table: str,
        config: TableConfig | Mapping[str, Any] | None = None,
        rate: float = 0.01,
        min_keys: int = DEFAULT_MIN_KEYS,
        seed: int = 0,
        keep_rate: float | None = None,
        overwrite: bool = False,
    ) -> None:
        if not isinstance(table, str):
            raise InvalidArgumentError(f"table must be a str, got {table!r}")
        if isinstance(min_keys, bool) or not isinstance(min_keys, int) or min_keys < 0:
            raise InvalidArgumentError(f"min_keys must be an int >= 0, got {min_keys!r}")
        conf = None if config is None else dict(_config_dict(config))
        rate = parse_rate(rate)
        if keep_rate is not None:
            try:
                keep_rate = parse_rate(keep_rate)
            except InvalidArgumentError:
                raise InvalidArgumentError(
                    f"keep_rate must be None or a number in (0, 1], got {keep_rate!r}"
                ) from None
            keep_rate = None if keep_rate <= rate else keep_rate  # rate already keeps more
        self.header = TraceHeader(
            table,
            conf,
            config_digest(conf),
            rate,
            parse_seed(seed),
            min_keys=min_keys,
            keep_rate=keep_rate,
        )
        self.path = Path(path)
        self._salt = np.uint64(salt_of(seed))
        self._smallest = SmallestHashes(min_keys, sample_threshold(keep_rate or rate))
        self._threshold = np.uint64(self._smallest.threshold)
        self._lock = threading.Lock()
        self._keys: list[Int64Array] = []
        self._meta: list[tuple[int, int, int, int, int]] = []  # op, step, kept, seen, counted
        self._buffered = 0
        self.batches = self.kept = self.seen = 0
        self._probe_every = 1  # min_keys: calls between probes of the smallest hashes
        self._probe_wait = 0
        self._closed = False
        self._file = open(self.path, "wb" if overwrite else "xb")
        head = json.dumps(self.header.to_dict(), sort_keys=True).encode()
        self._file.write(MAGIC + _U32.pack(len(head)) + head + _U32.pack(zlib.crc32(head)))
        self._writer = ChunkWriter(self._file, table)

    @classmethod
    def for_table(
        cls,
        table: Table,
        path: str | os.PathLike[str],
        *,
        rate: float = 0.01,
        min_keys: int = DEFAULT_MIN_KEYS,
        seed: int = 0,
        overwrite: bool = False,
    ) -> KeyRecorder:
        """A recorder whose header names ``table`` and its configuration.

        With ``min_keys`` (the default), the recorder also keeps at least ``keep_rate =
        CURRENT_SIZE_ROWS / rows`` of the keys for the table's smaller cache tier of ``rows``
        (DRAM, or HBM): ``evdb size`` then answers for the size the table has with a miniature
        of 2,048 rows, as it does larger sizes, which it may still subsample down to ``rate``
        (a raised ``rate`` would make their miniatures, and the analysis, larger)."""
        caches = [table.config.dram.capacity_rows]
        if table.config.hbm is not None:
            caches.append(table.config.hbm.capacity_rows)
        smallest = min((c for c in caches if c), default=None)
        keep_rate = None
        if min_keys and smallest is not None:
            keep_rate = min(1.0, CURRENT_SIZE_ROWS / smallest)
        return cls(
            path,
            table=table.name,
            config=table.config,
            rate=rate,
            min_keys=min_keys,
            seed=seed,
            keep_rate=keep_rate,
            overwrite=overwrite,
        )

    @property
    def rate(self) -> float:
        """The rate keys are kept at now: 1 at first where ``min_keys`` is set, falling to
        the rate asked for as the distinct keys grow."""
        return int(self._threshold) / FULL

    def record(self, op: str, keys: Int64Array, step: int, *, counted: int | None = None) -> None:
        """Keep the sampled keys of one call: ``op`` "pull" or "lookup", ``keys`` (n,) int64
        (as the table normalised them), ``step`` the database's step, ``counted`` the
        accesses the table's hit and miss counters count for the call (``Table.pull``: its
        distinct keys; a lookup counts every position, the default for "lookup"). Cheap: one
        numba pass over the keys and a copy of the kept ones (about ``rate`` of them)."""
        code = op_code(op)
        if self._closed:
            raise InvalidArgumentError(f"the recorder of {str(self.path)!r} is closed")
        k = keys if isinstance(keys, np.ndarray) else np.asarray(keys)
        if k.dtype != np.int64 or k.ndim != 1:
            raise InvalidArgumentError(f"keys must be a 1-d int64 array, got {k.dtype} {k.shape}")
        n = k.shape[0]
        if counted is None:
            counted = n if code == 1 else -1
        threshold = self._threshold  # read once: another thread may lower it (still safe)
        hashes = None
        settled = self._smallest.settled
        if threshold == FULL and settled:  # rate 1
            kept = k.copy()
        else:
            if not k.flags.c_contiguous:
                k = np.ascontiguousarray(k)
            out = np.empty(n, dtype=np.int64)
            if settled and threshold < SPARSE_THRESHOLD:
                scratch = np.empty(n, dtype=np.uint64)
                kept = out[: sample_sparse_into(k, self._salt, threshold, out, scratch)].copy()
            elif settled or self._probe_wait > 0:  # (min_keys: see _probed)
                self._probe_wait -= 1
                kept = out[: sample_into(k, self._salt, threshold, out)].copy()
            else:  # min_keys: the kept keys' hashes lower the threshold
                hashes = np.empty(n, dtype=np.uint64)
                kept = out[: sample_hashed_into(k, self._salt, threshold, out, hashes)].copy()
        with self._lock:
            if hashes is not None:  # fixed-size SHARDS: the threshold falls
                self._probed(hashes, kept.shape[0])
            self._book(code, int(step), kept, n, int(counted))

    @property
    def sampling(self) -> tuple[np.uint64, np.uint64]:
        """(salt, threshold) of the key hash now: a key is kept when its 53-bit salted hash
        is under the threshold (``Deduper.unique_sampled`` samples with them)."""
        return self._salt, self._threshold

    def record_kept(
        self, op: str, kept: Int64Array, hashes: np.ndarray, seen: int, step: int, counted: int
    ) -> None:
        """``record`` for a caller that sampled the call's keys itself with ``sampling``
        (``Table.pull``, in its dedup pass: ``Deduper.unique_sampled``): ``kept`` the kept
        keys in order (the recorder keeps the array), ``hashes`` the 53-bit hashes of the
        distinct ones (``min_keys`` enters them among the smallest; repeats change nothing
        there), ``seen`` the call's key count. The file is the one ``record`` writes."""
        code = op_code(op)
        if self._closed:
            raise InvalidArgumentError(f"the recorder of {str(self.path)!r} is closed")
        with self._lock:
            if not self._smallest.settled:  # as record: a probe every _probe_every calls
                if self._probe_wait > 0:
                    self._probe_wait -= 1
                else:
                    self._probed(hashes, hashes.shape[0])
            self._book(code, step, kept, seen, counted)

    def _book(self, code: int, step: int, kept: Int64Array, seen: int, counted: int) -> None:
        """Buffer a call (under the lock); a full buffer goes to the writer as a chunk."""
        self.batches += 1
        self.seen += seen
        self._keys.append(kept)
        self._meta.append((code, step, kept.shape[0], seen, counted))
        self._buffered += kept.shape[0]
        if self._buffered >= _CHUNK_KEYS or len(self._meta) >= _CHUNK_BATCHES:
            self._hand_over()

    def _probed(self, hashes: np.ndarray, n: int) -> None:
        """Enter a call's kept hashes among the smallest; a probe that found no new one
        doubles the calls until the next (up to PROBE_EVERY): a key space that stopped
        growing costs a probe per kept key on one call in 64, not every call (7 us of a
        250 us step at rate 0.38). A call between that would have lowered the threshold keeps
        a few more keys, which the reader drops (``_settle``)."""
        size, before = self._smallest.size, self._smallest.threshold
        self._threshold = np.uint64(self._smallest.add(hashes, n))
        if self._smallest.size != size or self._smallest.threshold != before:
            self._probe_every = 1
        else:
            self._probe_every = min(2 * self._probe_every, PROBE_EVERY)
        self._probe_wait = self._probe_every - 1

    def _hand_over(self) -> None:
        """The buffered calls to the writer thread, as one chunk (``ChunkWriter``)."""
        if not self._meta:
            return
        self._writer.put(self._meta, self._keys)
        self.kept += self._buffered
        self._keys, self._meta, self._buffered = [], [], 0

    def flush(self) -> None:
        """Write the buffered batches as a chunk (a reader with ``allow_incomplete`` sees
        them)."""
        with self._lock:
            if not self._closed:
                self._hand_over()
                self._writer.drain()
                self._file.flush()

    def close(self) -> None:
        """Write what is buffered and the end record; the file is then complete. A chunk
        that failed to be written is raised here (the file is closed without its end)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._hand_over()
                self._writer.close()
                body = _END_BODY.pack(self.batches, self.kept, self.seen)
                self._file.write(_END + body + _U32.pack(zlib.crc32(body)))
            finally:
                self._file.close()

    def __enter__(self) -> KeyRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"KeyRecorder({str(self.path)!r}, table={self.header.table!r}, "
            f"rate={self.header.rate}, min_keys={self.header.min_keys}, "
            f"keep_rate={self.header.keep_rate})"
        )


def _config_dict(config: Any) -> Mapping[str, Any]:
    if isinstance(config, Mapping):
        return config
    to_dict = getattr(config, "to_dict", None)
    if to_dict is None:
        raise InvalidArgumentError(f"config must be a TableConfig or a dict, got {config!r}")
    return to_dict()  # type: ignore[no-any-return]


# -- reading ----------------------------------------------------------------------------
class _Reader:
    """Reads a trace file front to back, naming the byte offset of anything wrong."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = path.read_bytes()
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.data):
            raise CorruptDataError(
                f"trace {str(self.path)!r} is truncated: {what} at byte {self.pos} needs "
                f"{n} bytes, {len(self.data) - self.pos} are left"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def bad(self, what: str) -> CorruptDataError:
        return CorruptDataError(f"trace {str(self.path)!r}: {what} (at byte {self.pos})")


def read_trace(
    path: str | os.PathLike[str],
    *,
    table: Table | str | None = None,
    allow_incomplete: bool = False,
) -> Trace:
    """Read a trace file a ``KeyRecorder`` wrote.

    Parameters
    ----------
    table : Table or str, optional
        Refuse (``InvalidArgumentError``) a trace recorded from another table: by name, and
        for a ``Table`` also by the digest of its configuration.
    allow_incomplete : bool
        Accept a file without its end record (the recorder was not closed), reading its
        complete chunks; a chunk cut short is still refused.

    Raises
    ------
    CorruptDataError
        Not a trace, truncated, or a checksum that does not match.
    """
    r = _Reader(Path(path))
    if r.take(len(MAGIC), "the magic") != MAGIC:
        raise r.bad("not an evdb key trace (bad magic)")
    (n,) = _U32.unpack(r.take(4, "the header length"))
    head = r.take(n, "the header")
    (crc,) = _U32.unpack(r.take(4, "the header checksum"))
    if zlib.crc32(head) != crc:
        raise r.bad("the header's checksum does not match")
    meta = json.loads(head)
    if meta.get("format") not in READS:
        raise r.bad(f"format {meta.get('format')!r}, this evdb reads {READS}")
    header = TraceHeader(
        meta["table"],
        meta["config"],
        meta["config_digest"],
        meta["rate"],
        meta["seed"],
        min_keys=int(meta.get("min_keys", 0)),
        keep_rate=meta.get("keep_rate"),
    )
    _check_table(header, table, r.path)
    parts: list[tuple[np.ndarray, ...]] = []
    complete = False
    while r.pos < len(r.data):
        tag = r.data[r.pos : r.pos + 4]
        if tag == _END:
            r.take(4, "the end record")
            body = r.take(_END_BODY.size, "the end record")
            (crc,) = _U32.unpack(r.take(4, "the end record's checksum"))
            if zlib.crc32(body) != crc:
                raise r.bad("the end record's checksum does not match")
            complete = True
            if r.pos != len(r.data):
                raise r.bad("bytes after the end record")
            break
        _, b, m, crc = CHUNK_HEAD.unpack(r.take(CHUNK_HEAD.size, "a chunk header"))
        if tag != CHUNK:
            raise r.bad(f"a chunk header expected, found {tag!r}")
        payload = r.take(b * 33 + m * 8, f"a chunk of {b} batches and {m} keys")
        if zlib.crc32(payload) != crc:
            raise r.bad("a chunk's checksum does not match")
        cols = np.frombuffer(payload, dtype="<i8", count=4 * b + m, offset=b)
        parts.append(
            (
                np.frombuffer(payload, dtype=np.uint8, count=b),
                *np.split(cols, [b, 2 * b, 3 * b, 4 * b]),
            )
        )
    trace = _assemble(header, parts, complete)
    if not complete:
        if not allow_incomplete:
            raise CorruptDataError(
                f"trace {str(r.path)!r} is truncated: it has no end record (the recorder was "
                f"not closed, or the file was cut after {trace.n_batches} batches); pass "
                "allow_incomplete=True to read its complete chunks"
            )
    else:
        calls, kept, seen = _END_BODY.unpack(body)
        if (calls, kept, seen) != (trace.n_batches, trace.keys.shape[0], int(trace.seen.sum())):
            raise r.bad(
                f"the end record counts {calls} calls, {kept} keys kept of {seen}; the chunks "
                f"hold {trace.n_batches}, {trace.keys.shape[0]} of {int(trace.seen.sum())}"
            )
    return _settle(trace)


def _check_table(header: TraceHeader, table: Table | str | None, path: Path) -> None:
    if table is None:
        return
    name = table if isinstance(table, str) else table.name
    if header.table != name:
        raise InvalidArgumentError(
            f"trace {str(path)!r} was recorded from table {header.table!r}, not {name!r}"
        )
    if not isinstance(table, str):
        digest = config_digest(table.config.to_dict())
        if digest != header.config_digest:
            raise InvalidArgumentError(
                f"trace {str(path)!r} was recorded from another table called {name!r}: its "
                f"configuration digest is {header.config_digest[:12]}, this table's {digest[:12]}"
            )


def _assemble(header: TraceHeader, parts: list[tuple[np.ndarray, ...]], complete: bool) -> Trace:
    def cat(i: int, dtype: Any) -> np.ndarray:
        if not parts:
            return np.zeros(0, dtype=dtype)
        return np.concatenate([p[i] for p in parts]).astype(dtype)

    ops = cat(0, np.uint8)
    if ops.size and int(ops.max()) >= len(OPS):
        raise CorruptDataError(f"trace of table {header.table!r}: op code {int(ops.max())}")
    lengths = cat(2, np.int64)
    bounds = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    steps, seen, counted, keys = (cat(i, np.int64) for i in (1, 3, 4, 5))
    return Trace(header, keys, bounds, ops, steps, seen, counted, complete)


def _settle(trace: Trace) -> Trace:
    """Drop the keys kept before the threshold fell to where it ended (``min_keys``), never
    below ``keep_rate``; the trace's rate is then that of its keys, its ``floor_rate`` the
    recorder's ``rate``."""
    header = trace.header
    if header.min_keys <= 0 and header.keep_rate is None:
        return trace
    lowest = header.keep_rate or header.rate
    salt, floor = salt_of(header.seed), sample_threshold(lowest)
    threshold = final_threshold(trace.keys, salt, header.min_keys, floor)
    settled = trace.subsample(threshold)
    rate = lowest if threshold == floor else settled.header.rate  # the floor: as asked
    header = dataclasses.replace(settled.header, rate=rate, floor_rate=header.rate)
    return dataclasses.replace(settled, header=header)
