"""Admission: which keys earn a row.

A policy is a frozen, validated config object; the rule itself is a pure function from counts
to an admit mask (``policy.admit(totals)``). The counts live in a state object the table owns
(``policy.new_state()``), which can be saved and restored so a restart keeps admission progress.

* :class:`AdmitAll` - every pulled key gets a row (what ``admission=None`` means).
* :class:`Counter` - exact per-key pull counts, DeepRec's CounterFilter. Memory is bounded by
  ``max_pending``: past it, the stalest pending counts (oldest last pull, then lowest count) are
  forgotten down to 90% of the bound, and the number forgotten is reported in ``stats()``.
  A forgotten key simply starts counting again. With TTL set, ``compact()`` also forgets
  pending counts not pulled within ``ttl_steps``.
* :class:`Bloom` - a counting Bloom filter of fixed memory (DeepRec's BloomFilter, TFRA's
  ``CBFFilter``): uint8 counters, estimate = min over the key's counters, which is never below
  the true count, so a key is never admitted late, and early only when all its counters are
  shared (about ``error_rate`` at ``capacity`` distinct keys).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from evdb._types import BoolArray, Int64Array
from evdb.errors import ConfigError, CorruptDataError
from evdb.hashindex import HashIndex, RowAllocator
from evdb.kernels import backend

cpu = backend("cpu")  # bound once: a call costs one attribute lookup

__all__ = ["AdmissionPolicy", "AdmissionState", "AdmitAll", "Bloom", "Counter", "from_dict"]


def _parse_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{name} must be an int, got {value!r}")
    if value < low or (high is not None and value > high):
        upper = "" if high is None else f", {high}]"
        raise ConfigError(f"{name} must be in [{low}{upper or ', inf)'}, got {value}")
    return int(value)


class AdmissionState:
    """Pull counts of keys that have no row yet."""

    def observe(self, keys: Int64Array, counts: Int64Array, step: int) -> Int64Array:
        """Add counts (n,) for distinct keys (n,); return each key's total (n,) int64."""
        raise NotImplementedError

    def forget(self, keys: Int64Array) -> None:
        """Drop what is known of keys (they got a row, or were deleted)."""

    def compact(self, min_live_step: int) -> int:
        """Forget counts last observed before min_live_step; return how many."""
        return 0

    def stats(self) -> dict[str, Any]:
        return {}

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        pass

    def absorb(
        self,
        olds: Sequence[AdmissionState],
        owns: Callable[[Int64Array], BoolArray],
        *,
        first: bool,
    ) -> None:
        """Take over the pending counts of the keys this state's shard owns (``owns``) from
        the states of the old shards (resharding), so that no count toward admission is
        lost or doubled. ``first``: this is the first new shard (it carries totals that
        belong to no key). No pending counts: nothing to take."""


@dataclass(frozen=True)
class AdmissionPolicy:
    """Base of admission configs."""

    kind: ClassVar[str] = ""
    counts_pulls: ClassVar[bool] = True
    """False when every key is admitted on its first pull: nothing to count, so ``pull``
    skips the admission state."""
    min_count: int = 1

    def admit(self, totals: Int64Array) -> BoolArray:
        """The rule: admit keys whose pull count has reached ``min_count``."""
        return totals >= self.min_count

    def new_state(self) -> AdmissionState:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


class _NoState(AdmissionState):
    def observe(self, keys: Int64Array, counts: Int64Array, step: int) -> Int64Array:
        return counts


@dataclass(frozen=True)
class AdmitAll(AdmissionPolicy):
    """Every pulled key is admitted on its first pull."""

    kind: ClassVar[str] = "all"
    counts_pulls: ClassVar[bool] = False
    min_count: int = 1

    def __post_init__(self) -> None:
        if self.min_count != 1:
            raise ConfigError(f"AdmitAll.min_count is always 1, got {self.min_count}")

    def new_state(self) -> AdmissionState:
        return _NoState()


@dataclass(frozen=True)
class Counter(AdmissionPolicy):
    """Admit a key on the pull where its exact pull count reaches ``min_count``.

    Parameters
    ----------
    min_count : int
        Pulls (every occurrence in a batch counts) before a key gets a row; >= 1.
    max_pending : int
        Most keys whose counts are remembered at once (bounds memory at about 60 bytes a key).
    """

    kind: ClassVar[str] = "counter"
    min_count: int = 3
    max_pending: int = 10_000_000

    def __post_init__(self) -> None:
        _parse_int("Counter.min_count", self.min_count, 1)
        _parse_int("Counter.max_pending", self.max_pending, 1)

    def new_state(self) -> AdmissionState:
        return _CounterState(self.max_pending)


@dataclass(frozen=True)
class Bloom(AdmissionPolicy):
    """Admit a key once a counting Bloom filter estimates ``min_count`` pulls.

    Parameters
    ----------
    min_count : int
        Pulls before a key gets a row, in [1, 255] (counters are uint8 and saturate at 255).
    capacity : int
        Distinct keys the filter is sized for.
    error_rate : float
        Rate of early admission at ``capacity`` distinct keys, in (0, 1).
    seed : int
        Hash seed.
    """

    kind: ClassVar[str] = "bloom"
    min_count: int = 3
    capacity: int = 10_000_000
    error_rate: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        _parse_int("Bloom.min_count", self.min_count, 1, 255)
        _parse_int("Bloom.capacity", self.capacity, 1)
        _parse_int("Bloom.seed", self.seed, 0, 2**63 - 1)
        if not isinstance(self.error_rate, float) or not 0.0 < self.error_rate < 1.0:
            raise ConfigError(
                f"Bloom.error_rate must be a float in (0, 1), got {self.error_rate!r}"
            )

    @property
    def width(self) -> int:
        """Counters: the optimal Bloom size m = -n ln p / (ln 2)^2."""
        return max(64, math.ceil(-self.capacity * math.log(self.error_rate) / math.log(2) ** 2))

    @property
    def n_hashes(self) -> int:
        """Hashes per key: k = (m / n) ln 2."""
        return max(1, round(self.width / self.capacity * math.log(2)))

    def new_state(self) -> AdmissionState:
        return _BloomState(self)


class _CounterState(AdmissionState):
    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self.index = HashIndex()
        self.alloc = RowAllocator()
        self.keys = np.empty(0, dtype=np.int64)
        self.counts = np.empty(0, dtype=np.int64)
        self.last_seen = np.empty(0, dtype=np.int64)
        self.forgotten = 0

    def _fit(self, n: int) -> None:
        if n <= self.keys.shape[0]:
            return
        cap = max(n, 2 * self.keys.shape[0], 1024)
        for name in ("keys", "counts", "last_seen"):
            old = getattr(self, name)
            new = np.zeros(cap, dtype=np.int64)
            new[: old.shape[0]] = old
            setattr(self, name, new)

    def observe(self, keys: Int64Array, counts: Int64Array, step: int) -> Int64Array:
        slots = self.index.find(keys)
        new = slots < 0
        if new.any():
            fresh = self.alloc.allocate(int(np.count_nonzero(new)))
            self._fit(self.alloc.high_water)
            self.index.insert(keys[new], fresh)
            self.keys[fresh] = keys[new]
            self.counts[fresh] = 0
            slots[new] = fresh
        self.counts[slots] += counts
        self.last_seen[slots] = step
        totals = self.counts[slots].copy()
        if self.index.size > self.max_pending:
            self._shed(int(self.max_pending * 0.9))
        return totals

    def _live_slots(self) -> Int64Array:
        return self.index.live_rows()

    def _drop(self, slots: Int64Array) -> None:
        self.index.remove(self.keys[slots])
        self.alloc.release(slots)

    def _shed(self, target: int) -> None:
        live = self._live_slots()
        n = live.shape[0] - target
        order = np.lexsort((self.counts[live], self.last_seen[live]))  # stalest first
        self._drop(live[order[:n]])
        self.forgotten += n

    def forget(self, keys: Int64Array) -> None:
        slots = self.index.remove(keys)
        self.alloc.release(slots[slots >= 0])

    def compact(self, min_live_step: int) -> int:
        live = self._live_slots()
        stale = live[self.last_seen[live] < min_live_step]
        self._drop(stale)
        self.forgotten += stale.shape[0]
        return int(stale.shape[0])

    def stats(self) -> dict[str, Any]:
        return {
            "pending": self.index.size,
            "forgotten": self.forgotten,
            "bytes": self.index.nbytes + 3 * self.keys.nbytes,
        }

    def to_arrays(self) -> dict[str, np.ndarray]:
        live = self._live_slots()
        return {
            "keys": self.keys[live],
            "counts": self.counts[live],
            "last_seen": self.last_seen[live],
            "forgotten": np.array([self.forgotten]),
        }

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        keys = arrays["keys"].astype(np.int64)
        slots = self.alloc.allocate(keys.shape[0])
        self._fit(self.alloc.high_water)
        self.index.insert(keys, slots)
        self.keys[slots] = keys
        self.counts[slots] = arrays["counts"]
        self.last_seen[slots] = arrays["last_seen"]
        self.forgotten = int(arrays["forgotten"][0])

    def absorb(
        self,
        olds: Sequence[AdmissionState],
        owns: Callable[[Int64Array], BoolArray],
        *,
        first: bool,
    ) -> None:
        """Per key: the old pending counts of the keys this shard owns (the count of keys
        forgotten goes to the first new shard)."""
        saved = [o.to_arrays() for o in olds]
        keys = np.concatenate([s["keys"] for s in saved]).astype(np.int64)
        mine = owns(keys)
        forgotten = sum(int(s["forgotten"][0]) for s in saved) if first else 0
        self.load_arrays(
            {
                "keys": keys[mine],
                "counts": np.concatenate([s["counts"] for s in saved])[mine],
                "last_seen": np.concatenate([s["last_seen"] for s in saved])[mine],
                "forgotten": np.array([forgotten]),
            }
        )


class _BloomState(AdmissionState):
    def __init__(self, policy: Bloom) -> None:
        self.counters = np.zeros(policy.width, dtype=np.uint8)
        self.n_hashes = policy.n_hashes
        self.seed = np.uint64(policy.seed)

    def observe(self, keys: Int64Array, counts: Int64Array, step: int) -> Int64Array:
        out = np.empty(keys.shape[0], dtype=np.int64)
        cpu.sketch_add(self.counters, keys, counts, self.n_hashes, self.seed, out)
        return out

    def stats(self) -> dict[str, Any]:
        return {
            "counters": int(self.counters.shape[0]),
            "hashes": self.n_hashes,
            "bytes": int(self.counters.nbytes),
            "fill": float(np.count_nonzero(self.counters)) / self.counters.shape[0],
        }

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"counters": self.counters}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        counters = arrays["counters"]
        if counters.shape != self.counters.shape or counters.dtype != np.uint8:
            raise CorruptDataError(
                f"bloom counters: saved shape {counters.shape} {counters.dtype} does not match "
                f"the configured {self.counters.shape} uint8"
            )
        self.counters[:] = counters

    def absorb(
        self,
        olds: Sequence[AdmissionState],
        owns: Callable[[Int64Array], BoolArray],
        *,
        first: bool,
    ) -> None:
        """The filter of every key, as one process would have it: the old shards' counters
        summed (saturating), on every new shard (a sketch cannot be split by key)."""
        total = np.sum([o.to_arrays()["counters"].astype(np.int64) for o in olds], axis=0)
        self.load_arrays({"counters": np.minimum(total, 255).astype(np.uint8)})


_KINDS: dict[str, type[AdmissionPolicy]] = {c.kind: c for c in (AdmitAll, Counter, Bloom)}


def from_dict(d: dict[str, Any]) -> AdmissionPolicy:
    """Rebuild a policy from ``AdmissionPolicy.to_dict()``."""
    fields = dict(d)
    kind = fields.pop("kind", None)
    if kind not in _KINDS:
        raise ConfigError(f"admission: unknown kind {kind!r}; expected one of {sorted(_KINDS)}")
    return _KINDS[kind](**fields)
