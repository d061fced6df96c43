"""A key trace's file constants, its in-memory form (``evdb.trace`` reads and writes it), and
the thread that writes its chunks.

``KeyRecorder.record`` buffers each call's kept keys; every 1M of them (or 65,536 calls) make a
chunk, whose columns are checksummed (crc32) and written to the file. At rate 0.38 that was a
chunk every ~340 steps of 8,192 keys, 5.5 ms of crc32 alone (1.45 GB/s here) and the write:
some 20-30 us a step, as much as the sampling itself, paid by one step in 340. A
``ChunkWriter`` takes the chunk's buffers from the calling thread, which goes on, and writes
them on a thread of its own (zlib's crc32 and the file's write release the GIL). At most
``QUEUED`` chunks wait, so a disk slower than the recording blocks ``record`` instead of
growing memory; a write that fails is raised by the next ``put``, ``drain`` or ``close``, on
the caller's thread.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import queue
import struct
import threading
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from evdb._types import Int64Array
from evdb.errors import InvalidArgumentError
from evdb.trace_sample import FULL, keep_under

__all__ = [
    "CHUNK",
    "CHUNK_HEAD",
    "DEFAULT_MIN_KEYS",
    "FORMAT",
    "MAGIC",
    "OPS",
    "QUEUED",
    "READS",
    "ChunkWriter",
    "Trace",
    "TraceHeader",
    "config_digest",
    "op_code",
    "parse_rate",
    "parse_seed",
    "salt_of",
    "write_chunk",
]

OPS = ("pull", "lookup")  # op codes 0 and 1 in the file
FORMAT = 2
READS = (1, 2)  # version 1: no min_keys (a fixed rate)
DEFAULT_MIN_KEYS = 32_768
MAGIC = b"EVDBTRC1"
CHUNK = b"CHNK"
CHUNK_HEAD = struct.Struct("<4sIQI")
QUEUED = 2  # chunks waiting for the writer thread at most


def config_digest(config: Mapping[str, Any] | None) -> str:
    """sha256 of a table configuration's canonical JSON (``TableConfig.to_dict()``), without
    the optimizer's learning rate (a schedule changes it while the trace is recorded)."""
    if config is not None and isinstance(config.get("optimizer"), Mapping):
        optimizer = {k: v for k, v in config["optimizer"].items() if k != "lr"}
        config = {**config, "optimizer": optimizer}
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def salt_of(seed: int) -> int:
    """The value XORed into keys before hashing, for a trace's seed."""
    return int(np.uint64(seed) ^ np.uint64(0x9E3779B97F4A7C15))


def parse_rate(rate: Any) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 < rate <= 1.0:
        raise InvalidArgumentError(f"rate must be a number in (0, 1], got {rate!r}")
    return float(rate)


def parse_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise InvalidArgumentError(f"seed must be an int in [0, 2**64), got {seed!r}")
    return seed


@dataclass(frozen=True)
class TraceHeader:
    """What a trace says about itself."""

    table: str
    """The table it was recorded from ("" for a user's log)."""
    config: dict[str, Any] | None
    """That table's ``TableConfig.to_dict()``, or None when unknown."""
    config_digest: str
    """``config_digest(config)``: what ``read_trace(table=...)`` compares."""
    rate: float
    """The fraction of the key space kept, in (0, 1]: in a file, the recorder's rate (the
    floor); in a ``Trace`` read from one, the rate its keys were kept at (above the floor
    where ``min_keys`` raised it)."""
    seed: int
    """Salt of the key hash that chose them."""
    source: str = "evdb"
    """"evdb" (a ``KeyRecorder``), or the kind of user log it was read from."""
    min_keys: int = 0
    """The rate was raised to keep at least this many distinct keys (0: a fixed rate)."""
    floor_rate: float | None = None
    """In a ``Trace``: the recorder's rate, under ``rate`` (None: the same as ``rate``)."""
    keep_rate: float | None = None
    """The rate the recorder never fell below, above ``rate`` (``KeyRecorder.for_table``: a
    miniature of ``CURRENT_SIZE_ROWS`` for the table's own size), while ``rate`` stays the
    floor ``evdb size`` may subsample larger sizes down to; None: ``rate``."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "table": self.table,
            "config": self.config,
            "config_digest": self.config_digest,
            "rate": self.rate,
            "seed": self.seed,
            "source": self.source,
            "min_keys": self.min_keys,
            "keep_rate": self.keep_rate,
        }


@dataclass(frozen=True)
class Trace:
    """A sampled key trace in memory: batches of kept keys with their operation and step.

    ::

        keys    [ 7 3 | 9 | 3 7 7 ]      (m,) int64, the kept keys, batch after batch
        bounds  [0,    2,  3,     6]     (b + 1,) int64, batch i is keys[bounds[i]:bounds[i+1]]
        ops     [pull, lookup, pull]     (b,) uint8, index into OPS
        steps   [0,    0,      1]        (b,) int64, the database's step at the call
        seen    [812,  40,     797]      (b,) int64, the batch's keys before sampling
        counted [430,  40,     415]      (b,) int64, accesses the table counts (-1: unknown)
    """

    header: TraceHeader
    keys: Int64Array
    bounds: Int64Array
    ops: np.ndarray
    steps: Int64Array
    seen: Int64Array
    counted: Int64Array
    complete: bool = True
    """False when read with ``allow_incomplete`` from a file without its end record."""

    def counted_total(self, op: str = "pull") -> int | None:
        """Accesses the table counted in the ``op`` calls, sampled or not (what a sampled
        miss count is divided by, as SHARDS-adj does); None if a call did not say."""
        c = self.counted[self.ops == OPS.index(op)]
        return None if (c < 0).any() else int(c.sum())

    @property
    def n_batches(self) -> int:
        return int(self.ops.shape[0])

    def subsample(self, threshold: int) -> Trace:
        """The trace of the keys whose hash is under ``threshold`` (an int in (0, 2**53], at
        most the trace's own: ``rate * 2**53``), batch by batch, at rate ``threshold /
        2**53``: a sample of this sample, as if recorded at that rate (spatial sampling
        nests). Every batch stays, also one left empty (its counts still count)."""
        keys, bounds = keep_under(self.keys, self.bounds, salt_of(self.header.seed), threshold)
        header = dataclasses.replace(self.header, rate=threshold / FULL)
        return dataclasses.replace(self, header=header, keys=keys, bounds=bounds)

    def batches(self) -> Iterator[tuple[str, int, Int64Array]]:
        """(op, step, keys) of each batch, in order."""
        b = self.bounds.tolist()
        for i, (op, step) in enumerate(zip(self.ops.tolist(), self.steps.tolist(), strict=True)):
            yield OPS[op], step, self.keys[b[i] : b[i + 1]]


def op_code(op: str) -> int:
    try:
        return OPS.index(op)
    except ValueError:
        raise InvalidArgumentError(f"op must be one of {OPS}, got {op!r}") from None


# -- the writer thread ------------------------------------------------------------------
Batches = list[tuple[int, int, int, int, int]]  # op, step, kept, seen, counted per call


def write_chunk(file: BinaryIO, meta_rows: Batches, keys: list[Int64Array]) -> None:
    """One chunk: ``CHNK | u32 n_batches | u64 n_keys | u32 crc32(payload) | payload``, the
    payload's columns checksummed and written one by one, not joined (joining a chunk of 1M
    keys at rate 0.38 cost 15 ms of copies)."""
    meta = np.array(meta_rows, dtype="<i8").reshape(-1, 5)
    flat = np.concatenate(keys).astype("<i8", copy=False) if keys else np.zeros(0, "<i8")
    columns = [meta[:, 0].astype(np.uint8)]
    columns += [np.ascontiguousarray(meta[:, j]) for j in range(1, 5)]
    columns.append(flat)
    crc = 0
    for column in columns:
        crc = zlib.crc32(column.data.cast("B"), crc)
    file.write(CHUNK_HEAD.pack(CHUNK, meta.shape[0], flat.shape[0], crc))
    for column in columns:
        file.write(column.data.cast("B"))


class ChunkWriter:
    """Writes the chunks handed to ``put`` to ``file``, in order, on a daemon thread."""

    def __init__(self, file: BinaryIO, name: str) -> None:
        self._file = file
        self._queue: queue.Queue[tuple[Batches, list[Int64Array]] | None] = queue.Queue(QUEUED)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"evdb-trace {name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._error is None:  # after a failure nothing more is written
                    write_chunk(self._file, *item)
            except BaseException as e:  # raised on the caller's thread, by raise_error
                self._error = e
            finally:
                self._queue.task_done()

    def raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def put(self, meta_rows: Batches, keys: list[Int64Array]) -> None:
        """Queue a chunk (blocks while ``QUEUED`` wait)."""
        self.raise_error()
        self._queue.put((meta_rows, keys))

    def drain(self) -> None:
        """Wait until every chunk queued is written."""
        self._queue.join()
        self.raise_error()

    def close(self) -> None:
        """Write what is queued and stop the thread."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self.raise_error()
