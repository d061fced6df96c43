"""Frozen quantised rows: a table's rows in one file that never changes, memory-mapped and
read in place, in the layout of ``evdb.kernels.reference.frozen``. A quantised serving
snapshot (``evdb.quantized``) holds one file per table.

The file, every section 64-byte aligned::

    magic "EVDBFRZ1" | header length (uint64 LE) | header JSON (space-padded)
    keys       (n,) int64 LE            ordered by mix64(key)
    directory  (B + 1,) int64 LE        where each hash bucket's rows start
    rows       (n, stride) uint8        per row: fp16 scale, fp16 bias, int8 / int4 codes

The header holds the layout (``rows``, ``dim``, ``dtype``, ``buckets``, ``stride``,
``file_bytes``), the xxh3-64 of everything after it (``body_xxh3_64``) and what the
caller adds (``meta``). Opening checks the magic, the header and the size (a truncated file
is refused), the directory's shape, and the checksum unless ``verify=False``; the memory
map is copy-on-write, so nothing can change the file (the kernels take writable arrays, and
none writes). The rows cost ``8 + stride`` bytes each plus 4-8 for the directory (2 rows a
bucket): int8 at dim 64, 80 bytes; int4, 48.

This module owns the memory, so it runs the kernels on it (``kernels``: "cpu" or
"reference"), as a cache tier does.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from evdb.errors import CorruptDataError, InvalidArgumentError
from evdb.kernels.cpu import frozen as cpu_frozen
from evdb.kernels.cpu import quantize as cpu_quantize
from evdb.kernels.reference import frozen as reference_frozen
from evdb.kernels.reference import lowp as reference_lowp

__all__ = [
    "QUANTIZED_BITS",
    "FrozenRows",
    "file_order",
    "frozen_file_bytes",
    "row_stride",
    "write_frozen",
]

MAGIC = b"EVDBFRZ1"
ALIGN = 64
QUANTIZED_BITS = {"int8": 8, "int4": 4}
_KERNELS = {"cpu": (cpu_frozen, cpu_quantize), "reference": (reference_frozen, reference_lowp)}
_WRITE_ROWS = 1 << 16  # rows permuted and written at a time
_HASH_BYTES = 1 << 24  # bytes checksummed at a time


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _layout(header_bytes: int, n: int, n_buckets: int, stride: int) -> dict[str, int]:
    """Byte offsets of the sections and the file's size."""
    keys = _aligned(header_bytes)
    directory = _aligned(keys + 8 * n)
    rows = _aligned(directory + 8 * (n_buckets + 1))
    return {"keys": keys, "directory": directory, "rows": rows, "end": rows + n * stride}


def row_stride(dim: int, dtype: str) -> int:
    """Bytes of one quantised row of dim columns in dtype ("int8" or "int4")."""
    return int(reference_lowp.quantized_row_bytes(dim, QUANTIZED_BITS[dtype]))


def frozen_file_bytes(n: int, dim: int, dtype: str) -> int:
    """About how many bytes a frozen file of n rows takes (without its header)."""
    stride = row_stride(dim, dtype)
    return 8 * n + 8 * (reference_frozen.bucket_count(n) + 1) + n * stride


def file_order(keys: np.ndarray) -> np.ndarray:
    """(n,) int64: the order ``write_frozen`` stores distinct keys (n,) int64 in (``keys[order]``
    is the file's), for what a caller keeps beside the file in the same order."""
    order, _ = reference_frozen.frozen_order(keys, reference_frozen.bucket_count(keys.shape[0]))
    return np.asarray(order, np.int64)


def _header_blob(header: dict[str, Any]) -> bytes:
    blob = json.dumps(header, sort_keys=True).encode()
    blob = MAGIC + len(blob).to_bytes(8, "little") + blob
    return blob + b" " * (_aligned(len(blob)) - len(blob))


def write_frozen(
    path: Path, keys: np.ndarray, rows: np.ndarray, *, dim: int, dtype: str, meta: dict[str, Any]
) -> int:
    """Write a frozen file of distinct keys (n,) int64 and their quantised rows (n, stride)
    uint8 (``quantize_rows``' layout; a memory map is fine: it is read a chunk at a time, in
    the file's order). Returns the file's size in bytes."""
    bits = QUANTIZED_BITS[dtype]
    n = keys.shape[0]
    stride = reference_lowp.quantized_row_bytes(dim, bits)
    if rows.shape != (n, stride):
        raise InvalidArgumentError(f"rows: expected ({n}, {stride}) uint8, got {rows.shape}")
    n_buckets = reference_frozen.bucket_count(n)
    order, directory = reference_frozen.frozen_order(keys, n_buckets)
    header: dict[str, Any] = {
        "format": "evdb-frozen-rows/1",
        "rows": n,
        "dim": dim,
        "dtype": dtype,
        "stride": stride,
        "buckets": n_buckets,
        "body_xxh3_64": "0" * 16,  # the same length as the digest written over it
        "meta": meta,
    }
    header["file_bytes"] = 0
    while True:  # the size is in the header, whose length moves the sections: settle it
        blob = _header_blob(header)
        at = _layout(len(blob), n, n_buckets, stride)
        if header["file_bytes"] == at["end"]:
            break
        header["file_bytes"] = at["end"]
    digest = xxhash.xxh3_64()
    with path.open("wb") as f:
        f.write(blob)

        def put(offset: int, data: bytes | memoryview) -> None:
            pad = offset - f.tell()
            if pad:
                f.write(b"\0" * pad)
                digest.update(b"\0" * pad)
            f.write(data)
            digest.update(data)

        put(at["keys"], np.ascontiguousarray(keys[order], "<i8").data)
        put(at["directory"], directory.astype("<i8").data)
        for a in range(0, n, _WRITE_ROWS):
            put(
                at["rows"] + a * stride, np.ascontiguousarray(rows[order[a : a + _WRITE_ROWS]]).data
            )
        put(at["end"], b"")
        header["body_xxh3_64"] = digest.hexdigest()
        f.seek(0)
        f.write(_header_blob(header))
    return int(at["end"])


class FrozenRows:
    """The rows of a frozen file, memory-mapped, and the lookups on them.

    Parameters
    ----------
    path : path
        A file ``write_frozen`` wrote.
    verify : bool
        Also check the body's checksum (reads the whole file once).
    kernels : "cpu" | "reference"
        The kernel backend the lookups run on.

    Raises
    ------
    CorruptDataError
        Naming the file: not a frozen file, a damaged header, a size other than the one the
        header records (truncated), a damaged directory, or (``verify``) a checksum mismatch.
    """

    def __init__(self, path: str | os.PathLike[str], *, verify: bool = True, kernels: str = "cpu"):
        if kernels not in _KERNELS:
            raise InvalidArgumentError(f"kernels must be one of {tuple(_KERNELS)}, got {kernels!r}")
        self._search, self._dequantize = _KERNELS[kernels]
        self.path = Path(path)
        with self.path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(16)
            if len(head) < 16 or head[:8] != MAGIC:
                raise CorruptDataError(f"{self.path}: not an evdb frozen-rows file (no magic)")
            length = int.from_bytes(head[8:], "little")
            if length > min(size, 1 << 24):
                raise CorruptDataError(f"{self.path}: header length {length} is damaged")
            header = self._parse(f.read(length))
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        if size != header["file_bytes"]:
            raise CorruptDataError(
                f"{self.path}: {size} bytes, its header says {header['file_bytes']}: truncated "
                "or damaged"
            )
        self.header = header
        self.meta: dict[str, Any] = header["meta"]
        self.n_rows: int = header["rows"]
        self.dim: int = header["dim"]
        self.dtype: str = header["dtype"]
        self.stride: int = header["stride"]
        self.bits = QUANTIZED_BITS[self.dtype]
        self.nbytes = size
        at = _layout(16 + length, self.n_rows, header["buckets"], header["stride"])
        if verify:
            self._check_digest(_aligned(16 + length), header["body_xxh3_64"])
        mm, n = self._mm, self.n_rows
        self.keys = np.frombuffer(mm, "<i8", n, at["keys"])
        self.directory = np.frombuffer(mm, "<i8", header["buckets"] + 1, at["directory"])
        stride = header["stride"]
        self.rows = np.frombuffer(mm, np.uint8, n * stride, at["rows"]).reshape(n, stride)
        d = self.directory
        if d[0] != 0 or d[-1] != n or (np.diff(d) < 0).any():
            raise CorruptDataError(f"{self.path}: its bucket directory is damaged")

    def _parse(self, blob: bytes) -> dict[str, Any]:
        try:
            header = json.loads(blob)
            ok = header["format"] == "evdb-frozen-rows/1" and header["dtype"] in QUANTIZED_BITS
            n, dim, buckets = header["rows"], header["dim"], header["buckets"]
            ints = (n, dim, buckets, header["stride"], header["file_bytes"])
            ok = ok and all(isinstance(v, int) and not isinstance(v, bool) for v in ints)
            ok = ok and n >= 0 and dim >= 1 and buckets >= 2 and buckets & (buckets - 1) == 0
            bits = QUANTIZED_BITS[header["dtype"]]
            ok = ok and header["stride"] == reference_lowp.quantized_row_bytes(dim, bits)
            ok = ok and isinstance(header["meta"], dict) and len(header["body_xxh3_64"]) == 16
            at = _layout(16 + len(blob), n, buckets, header["stride"])
            ok = ok and header["file_bytes"] == at["end"]
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptDataError(f"{self.path}: its header is damaged ({e})") from None
        if not ok:
            raise CorruptDataError(f"{self.path}: its header is damaged")
        return dict(header)

    def _check_digest(self, start: int, want: str) -> None:
        digest = xxhash.xxh3_64()
        view = memoryview(self._mm)
        try:
            for a in range(start, len(view), _HASH_BYTES):
                digest.update(view[a : a + _HASH_BYTES])
        finally:
            view.release()
        if digest.hexdigest() != want:
            raise CorruptDataError(
                f"{self.path}: checksum mismatch (xxh3-64 {digest.hexdigest()}, its header "
                f"says {want}): the file is damaged"
            )

    # -- lookups ------------------------------------------------------------------------
    def lookup(self, keys: np.ndarray, out: np.ndarray, out_rows: np.ndarray) -> int:
        """out (n, dim) float32 gets the dequantised row of each key (n,) int64 found,
        untouched for the others; out_rows (n,) int64 its row or -1. Returns the keys not
        found."""
        return int(
            self._search.search_gather_dequantized(
                self.directory, self.keys, self.rows, self.bits, keys, out, out_rows
            )
        )

    def find(self, keys: np.ndarray) -> np.ndarray:
        """(n,) int64: each key's row, or -1."""
        rows = np.empty(keys.shape[0], np.int64)
        none = np.empty((keys.shape[0], 0), np.float32)  # search only: no column to fill
        self._search.search_gather_dequantized(
            self.directory, self.keys, self.rows, self.bits, keys, none, rows
        )
        return rows

    def lookup_bags(
        self,
        keys: np.ndarray,
        bounds: np.ndarray,
        weights: np.ndarray,
        combiner: int,
        max_norm: float,
        defaults: tuple[int, int, float, float],
        out: np.ndarray,
    ) -> int:
        """Bags combined into out (B, dim) float32 by the fused kernel (a key not found
        reads its default value, ``defaults`` = the initializer's kernel parameters).
        Returns the keys not found."""
        return int(
            self._search.search_gather_combine_dequantized(
                self.directory,
                self.keys,
                self.rows,
                self.bits,
                keys,
                bounds,
                weights,
                combiner,
                max_norm,
                *defaults,
                out,
            )
        )

    def values(self, lo: int, hi: int) -> np.ndarray:
        """(hi - lo, dim) float32: rows lo .. hi - 1 dequantised."""
        out = np.empty((hi - lo, self.dim), np.float32)
        self._dequantize.dequantize_rows(self.rows, self.bits, np.arange(lo, hi), out)
        return out

    def chunks(self, chunk_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(keys, values float32) chunks of every row, in the file's order."""
        for a in range(0, self.n_rows, chunk_rows):
            b = min(a + chunk_rows, self.n_rows)
            yield self.keys[a:b].astype(np.int64), self.values(a, b)

    def close(self) -> None:
        """Unmap the file once no array of it is held elsewhere (else when they go)."""
        self.keys = self.directory = np.empty(0, np.int64)
        self.rows = np.empty((0, self.header["stride"]), np.uint8)
        try:
            self._mm.close()
        except BufferError:  # a caller still holds a view: the map goes with it
            pass
