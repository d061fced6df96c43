"""Which keys a tier may hold: a scalable Bloom filter (Almeida et al., 2007) in memory.

A table that spills to disk asks RocksDB for every key its DRAM tier misses, and most misses
of a long-tailed stream are keys that were never written down (new keys, keys admission has not
let in yet). A RocksDB read of such a key costs a multi-get slot and a bloom probe inside
RocksDB; this filter answers "certainly not on disk" in memory first.

No false negatives: every key written is added. Keys are never removed (a removed key is a
false positive until the filter is rebuilt, which costs only a wasted read). When a stage holds
its capacity a new stage twice as large, with half the error rate, is added, so the total false
positive rate stays below twice the first stage's (1%); memory is 1.4 to 3 bytes per key
(about 11-13 bits per key per stage, and the newest stage is allocated before it fills).
"""

from __future__ import annotations

import math

import numpy as np

from evdb._types import BoolArray, Int64Array
from evdb.kernels import cpu

_FIRST_CAPACITY = 1 << 16
_FIRST_ERROR = 0.005
_SEED = np.uint64(0x9E3779B97F4A7C15)


class _Stage:
    def __init__(self, capacity: int, error: float) -> None:
        bits = math.ceil(-capacity * math.log(error) / math.log(2) ** 2)
        self.capacity = capacity
        self.error = error
        self.n_hashes = max(1, round(-math.log2(error)))
        self.bits = np.zeros((bits + 63) // 64, dtype=np.uint64)
        self.count = 0


class KeyFilter:
    """Keys added so far, to a false-positive rate below 1% and no false negatives."""

    def __init__(self) -> None:
        self.stages = [_Stage(_FIRST_CAPACITY, _FIRST_ERROR)]

    @property
    def nbytes(self) -> int:
        return sum(s.bits.nbytes for s in self.stages)

    def add(self, keys: Int64Array) -> None:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        start = 0
        while start < keys.shape[0]:
            stage = self.stages[-1]
            if stage.count >= stage.capacity:
                stage = _Stage(2 * stage.capacity, stage.error / 2)
                self.stages.append(stage)
            take = keys[start : start + (stage.capacity - stage.count)]
            cpu.bloom_add(stage.bits, take, stage.n_hashes, _SEED)
            stage.count += take.shape[0]
            start += take.shape[0]

    def may_contain(self, keys: Int64Array) -> BoolArray:
        """False: the key was never added; True: it may have been."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        out = np.zeros(keys.shape[0], dtype=bool)
        hit = np.empty(keys.shape[0], dtype=bool)
        for stage in self.stages:
            if stage.count:
                cpu.bloom_query(stage.bits, keys, stage.n_hashes, _SEED, hit)
                out |= hit
        return out

    def to_arrays(self) -> dict[str, np.ndarray]:
        arrays = {
            "shape": np.array(
                [[s.capacity, s.count, s.bits.shape[0]] for s in self.stages], dtype=np.int64
            ),
            "error": np.array([s.error for s in self.stages], dtype=np.float64),
        }
        for i, stage in enumerate(self.stages):
            arrays[f"bits{i}"] = stage.bits
        return arrays

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        stages = []
        for i, ((capacity, count, words), error) in enumerate(
            zip(arrays["shape"].tolist(), arrays["error"].tolist(), strict=True)
        ):
            stage = _Stage(capacity, error)
            bits = arrays[f"bits{i}"]
            if bits.shape != (words,) or bits.shape != stage.bits.shape:
                raise ValueError(f"key filter stage {i}: {bits.shape[0]} words, expected {words}")
            stage.bits[:] = bits
            stage.count = count
            stages.append(stage)
        self.stages = stages
