"""Which keys a tier may hold: a scalable (Almeida et al., 2007) blocked Bloom filter in memory.

A table that spills to disk asks RocksDB for every key its DRAM tier misses, and most misses
of a long-tailed stream are keys that were never written down (new keys, keys admission has not
let in yet). A RocksDB read of such a key costs a multi-get slot and a bloom probe inside
RocksDB; this filter answers "certainly not on disk" in memory first.

No false negatives: every key written is added. Keys are never removed (a removed key is a
false positive until the filter is rebuilt, which costs only a wasted read). When a stage holds
its capacity a new stage twice as large, with half the error rate, is added, so the total false
positive rate stays below twice the first stage's (1%). Each stage is a blocked Bloom filter
(``evdb.kernels.reference.bloom``): a key's 8 bits lie in one 64-byte block, so asking for a
key reads one cache line per stage, and one kernel call asks every stage, with the blocks of
keys ahead prefetched. The classic filter it replaces read one line per bit (8-13 a stage) and
computed a 64-bit modulo for each: about 1 us a key asked in the spilling run (bench/README).
A blocked stage needs about 6-20% more bits than a classic one at the same error rate (11.7
against 11.0 bits a key at 0.5%): 1.5 to 3 bytes per key in all.

Saved state (``to_arrays``) is versioned by ``format``. A state saved before (no ``format``:
classic stages) still loads: its stages are kept and asked beside the new ones, and keys
added after go into blocked stages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from evdb._types import BoolArray, Int64Array
from evdb.errors import CorruptDataError
from evdb.kernels import cpu
from evdb.kernels.cpu import bloom
from evdb.kernels.reference.bloom import BLOCK_WORDS

__all__ = ["FORMAT", "KeyFilter", "blocks_for"]

FORMAT = 2  # 1: classic stages only (saved without a "format" entry); 2: blocked stages
_FIRST_CAPACITY = 1 << 16
_FIRST_ERROR = 0.005
_SEED = np.uint64(0x9E3779B97F4A7C15)
_STAGE_GAMMA = 0xD1B54A32D192ED03  # stage s hashes with seed _SEED ^ (s * gamma)
_BLOCK_BITS = 64 * BLOCK_WORDS
_LINE = 64  # bytes: blocks start on a cache line, so a block is one line


def blocks_for(capacity: int, error: float) -> int:
    """Blocks a stage of ``capacity`` keys needs for a false-positive rate at most ``error``.

    A block holding l keys answers "maybe" for a key never added when each of its 8 words
    has that key's bit set: probability ``(1 - (1 - 1/64)^l)^8``, l being Poisson with mean
    capacity / blocks; the rate is its mean over l.
    """
    blocks = max(1, math.ceil(capacity * 8 / _BLOCK_BITS))
    while _false_positive_rate(capacity / blocks) > error:
        blocks = math.ceil(blocks * 1.02) + 1
    if blocks >= 1 << 32:
        raise ValueError(f"key filter: a stage of {capacity} keys needs {blocks} blocks (< 2^32)")
    return blocks


def _false_positive_rate(keys_per_block: float) -> float:
    load = np.arange(0, int(keys_per_block * 4 + 64))
    log_pmf = (
        load * math.log(keys_per_block)
        - keys_per_block
        - np.array([math.lgamma(x + 1.0) for x in load.tolist()])
    )
    word_set = 1.0 - (1.0 - BLOCK_WORDS / _BLOCK_BITS) ** load  # one word's bit is set
    return float((np.exp(log_pmf) * word_set**BLOCK_WORDS).sum())


def _aligned_blocks(n: int) -> np.ndarray:
    """A zeroed (n, BLOCK_WORDS) uint64 array whose first block starts on a cache line."""
    raw = np.zeros(n * BLOCK_WORDS + _LINE // 8, dtype=np.uint64)
    skip = (-raw.ctypes.data % _LINE) // 8
    return raw[skip : skip + n * BLOCK_WORDS].reshape(n, BLOCK_WORDS)


@dataclass
class _Stage:
    """A blocked stage: blocks[start : start + size] of the filter's array."""

    capacity: int
    error: float
    start: int
    size: int
    seed: np.uint64
    count: int = 0


class _ClassicStage:
    """A stage of a state saved in format 1: a classic Bloom filter, read-only."""

    def __init__(self, capacity: int, count: int, error: float, bits: np.ndarray) -> None:
        self.capacity = capacity
        self.count = count
        self.error = error
        self.n_hashes = max(1, round(-math.log2(error)))
        self.bits = np.ascontiguousarray(bits, dtype=np.uint64)


class KeyFilter:
    """Keys added so far, to a false-positive rate below 1% and no false negatives."""

    def __init__(self) -> None:
        self.stages: list[_Stage] = []
        self.classic: list[_ClassicStage] = []
        self.blocks = _aligned_blocks(0)
        self._add_stage(_FIRST_CAPACITY, _FIRST_ERROR)

    @property
    def nbytes(self) -> int:
        return int(self.blocks.nbytes + sum(s.bits.nbytes for s in self.classic))

    def _add_stage(self, capacity: int, error: float) -> _Stage:
        size = blocks_for(capacity, error)
        start = self.blocks.shape[0]
        blocks = _aligned_blocks(start + size)
        blocks[:start] = self.blocks
        self.blocks = blocks
        seed = _SEED ^ np.uint64((len(self.stages) * _STAGE_GAMMA) % (1 << 64))
        stage = _Stage(capacity, error, start, size, seed)
        self.stages.append(stage)
        self._index_stages()
        return stage

    def _index_stages(self) -> None:
        """The kernel's view of the stages that hold keys: starts, sizes (int64), seeds."""
        live = [s for s in self.stages if s.count]
        self._starts = np.array([s.start for s in live], dtype=np.int64)
        self._sizes = np.array([s.size for s in live], dtype=np.int64)
        self._seeds = np.array([s.seed for s in live], dtype=np.uint64)

    def add(self, keys: Int64Array) -> None:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        start = 0
        while start < keys.shape[0]:
            stage = self.stages[-1]
            if stage.count >= stage.capacity:
                stage = self._add_stage(2 * stage.capacity, stage.error / 2)
            take = keys[start : start + (stage.capacity - stage.count)]
            bloom.blocked_bloom_add(self.blocks, stage.start, stage.size, take, stage.seed)
            was_empty = stage.count == 0
            stage.count += take.shape[0]
            start += take.shape[0]
            if was_empty:
                self._index_stages()

    def may_contain(self, keys: Int64Array) -> BoolArray:
        """False: the key was never added; True: it may have been."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        out = np.empty(keys.shape[0], dtype=bool)
        bloom.blocked_bloom_query(self.blocks, self._starts, self._sizes, self._seeds, keys, out)
        if self.classic:
            hit = np.empty(keys.shape[0], dtype=bool)
            for old in self.classic:
                cpu.bloom_query(old.bits, keys, old.n_hashes, _SEED, hit)
                out |= hit
        return out

    def to_arrays(self) -> dict[str, np.ndarray]:
        arrays = {
            "format": np.array([FORMAT], dtype=np.int64),
            # per blocked stage: capacity, keys added, first block, blocks
            "stages": np.array(
                [[s.capacity, s.count, s.start, s.size] for s in self.stages], dtype=np.int64
            ).reshape(-1, 4),
            "errors": np.array([s.error for s in self.stages], dtype=np.float64),
            "seeds": np.array([s.seed for s in self.stages], dtype=np.uint64),
            "blocks": self.blocks.reshape(-1),
        }
        if self.classic:
            arrays.update(_classic_arrays(self.classic))
        return arrays

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        if "format" not in arrays:  # format 1: classic stages, saved as "shape", "error"
            classic = _load_classic(arrays, "")
            self.classic = classic
            self.stages = []
            self.blocks = _aligned_blocks(0)
            last = classic[-1] if classic else None
            self._add_stage(
                2 * last.capacity if last else _FIRST_CAPACITY,
                last.error / 2 if last else _FIRST_ERROR,
            )
            return
        version = int(arrays["format"][0])
        if version != FORMAT:
            raise CorruptDataError(
                f"key filter: saved in format {version}; this evdb reads formats 1 and {FORMAT}"
            )
        stages: list[_Stage] = []
        for i, ((capacity, count, start, size), error, seed) in enumerate(
            zip(
                arrays["stages"].tolist(),
                arrays["errors"].tolist(),
                arrays["seeds"].tolist(),
                strict=True,
            )
        ):
            expect = sum(s.size for s in stages)
            if start != expect or size != blocks_for(capacity, error):
                raise CorruptDataError(
                    f"key filter stage {i}: blocks {start}..{start + size}, expected "
                    f"{expect}..{expect + blocks_for(capacity, error)}"
                )
            stages.append(_Stage(capacity, error, start, size, np.uint64(seed), count))
        total = sum(s.size for s in stages)
        flat = arrays["blocks"]
        if flat.shape != (total * BLOCK_WORDS,):
            raise CorruptDataError(
                f"key filter: {flat.shape[0]} words saved, expected {total * BLOCK_WORDS}"
            )
        blocks = _aligned_blocks(total)
        blocks.reshape(-1)[:] = flat
        self.classic = _load_classic(arrays, "classic_") if "classic_shape" in arrays else []
        self.stages, self.blocks = stages, blocks
        self._index_stages()


def _classic_arrays(stages: list[_ClassicStage]) -> dict[str, np.ndarray]:
    arrays = {
        "classic_shape": np.array(
            [[s.capacity, s.count, s.bits.shape[0]] for s in stages], dtype=np.int64
        ),
        "classic_error": np.array([s.error for s in stages], dtype=np.float64),
    }
    for i, stage in enumerate(stages):
        arrays[f"classic_bits{i}"] = stage.bits
    return arrays


def _load_classic(arrays: dict[str, np.ndarray], prefix: str) -> list[_ClassicStage]:
    """Classic stages, as format 1 saved them (prefix "") or format 2 keeps them
    ("classic_")."""
    shape = arrays[f"{prefix}shape"].reshape(-1, 3).tolist()
    errors = arrays[f"{prefix}error"].tolist()
    stages = []
    for i, ((capacity, count, words), error) in enumerate(zip(shape, errors, strict=True)):
        bits = arrays[f"{prefix}bits{i}"]
        expect = math.ceil(-capacity * math.log(error) / math.log(2) ** 2)
        if bits.shape != (words,) or words != (expect + 63) // 64:
            raise CorruptDataError(
                f"key filter stage {i}: {bits.shape[0]} words, expected {(expect + 63) // 64}"
            )
        stages.append(_ClassicStage(capacity, count, error, bits))
    return stages
