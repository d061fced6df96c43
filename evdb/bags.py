"""Bag arguments (torch.nn.EmbeddingBag's offsets, per_sample_weights, mode and max_norm),
validated once and turned into what the bag kernels take."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from evdb._types import BoolArray, Float32Array, Int64Array
from evdb.arrays import check_lookup_buffers
from evdb.errors import InvalidArgumentError, InvalidTypeError

COMBINERS = {"sum": 0, "mean": 1, "sqrtn": 2}


@dataclass(frozen=True)
class Bags:
    """bounds (B + 1,) int64: bag b spans positions bounds[b]:bounds[b+1]; weights (n,)
    float32; combiner code; max_norm (inf = no clipping)."""

    bounds: Int64Array
    weights: Float32Array
    combiner: int
    max_norm: float

    @property
    def n_bags(self) -> int:
        return int(self.bounds.shape[0] - 1)


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def parse_offsets(offsets: Any, n: int) -> Int64Array:
    """EmbeddingBag offsets (B,) -> bounds (B + 1,), or raise naming the first bad element."""
    arr = np.asarray(offsets)
    if arr.ndim != 1:
        raise InvalidArgumentError(f"offsets must be 1-D, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise InvalidTypeError(f"offsets must hold integers, got dtype {arr.dtype}")
    off = arr.astype(np.int64)
    if off.size == 0:
        if n:
            raise InvalidArgumentError(f"offsets is empty but there are {n} keys")
        return np.zeros(1, dtype=np.int64)
    if off[0] != 0:
        raise InvalidArgumentError(f"offsets[0] must be 0, got {off[0]}")
    down = np.diff(off) < 0
    if down.any():
        i = _first(down) + 1
        raise InvalidArgumentError(
            f"offsets must be non-decreasing: offsets[{i}] = {off[i]} < "
            f"offsets[{i - 1}] = {off[i - 1]}"
        )
    if off[-1] > n:
        i = _first(off > n)
        raise InvalidArgumentError(f"offsets[{i}] = {off[i]} is past the end of keys (n={n})")
    return np.concatenate([off, [n]])


def parse_bags(
    n: int, offsets: Any, weights: Any, combiner: str | None, max_norm: float | None
) -> Bags:
    """Validate bag arguments for n keys. ``offsets=None`` makes each key its own bag."""
    if offsets is None:
        if weights is not None or combiner is not None:
            raise InvalidArgumentError("weights and combiner need offsets (bags of keys)")
        bounds = np.arange(n + 1, dtype=np.int64)
        combiner = "sum"
    else:
        bounds = parse_offsets(offsets, n)
        combiner = "mean" if combiner is None else combiner
    if combiner not in COMBINERS:
        raise InvalidArgumentError(f"combiner must be one of {sorted(COMBINERS)}, got {combiner!r}")
    if weights is None:
        w = np.ones(n, dtype=np.float32)
    else:
        arr = np.asarray(weights)
        if arr.dtype.kind not in "fiu":
            raise InvalidTypeError(f"weights must be floats, got dtype {arr.dtype}")
        if arr.shape != (n,):
            raise InvalidArgumentError(f"weights must have shape ({n},) like keys, got {arr.shape}")
        w = np.ascontiguousarray(arr, dtype=np.float32)
        bad = ~np.isfinite(w)
        if bad.any():
            i = _first(bad)
            raise InvalidArgumentError(f"weights[{i}] = {arr[i]} is not finite")
    if max_norm is None:
        norm = math.inf
    elif (
        isinstance(max_norm, bool)
        or not isinstance(max_norm, (int, float))
        or not (math.isfinite(max_norm) and max_norm > 0)
    ):
        raise InvalidArgumentError(
            f"max_norm must be a finite number > 0 or None, got {max_norm!r}"
        )
    else:
        norm = float(max_norm)
    return Bags(bounds, w, COMBINERS[combiner], norm)


def parse_lookup(
    n: int,
    dim: int,
    offsets: Any,
    weights: Any,
    combiner: str | None,
    max_norm: float | None,
    out: Float32Array | None,
    found: BoolArray | None,
) -> tuple[Bags | None, tuple[int, int]]:
    """A lookup of n keys' bag arguments and buffers checked (``Table.lookup``'s and every
    reader's that answers like it): its bags (None: plain rows, one a key) and the shape of
    its answer."""
    plain = offsets is None and weights is None and combiner is None and max_norm is None
    bags = None if plain else parse_bags(n, offsets, weights, combiner, max_norm)
    shape = (n if bags is None else bags.n_bags, dim)
    check_lookup_buffers(out, shape, found, n)
    return bags, shape
