"""Which rank owns a key: the placement of a sharded table.

Three strategies, each a pure function of the key and the number of shards ``N``:

``"hash"`` (the default)
    ``bucket = fmix64(key) mod B`` (murmur3's 64-bit finaliser over the key's two's-complement
    bits), and rank ``r`` owns the contiguous buckets ``[r * B // N, (r + 1) * B // N)``. ``B``
    (``buckets``, 1024 by default) is fixed when the table is created, as the anchors fix
    theirs for a model's lifetime (DeepRec checkpoints 1000 key buckets). The mix spreads
    sequential, strided and clustered ids evenly, and a new ``N`` moves whole buckets, so
    resharding reads only the old shards whose bucket ranges overlap the new one's.
``"mod"``
    TF's ``mod`` partition strategy: ``key mod N`` with Python's sign convention (a negative
    key goes to ``N - (-key mod N)``). Ids with a stride that shares a factor with ``N`` pile
    onto a few shards (ids that are all even leave the odd ranks empty).
``"div"``
    TF's ``div`` strategy over ``num_ids`` keys in ``[0, num_ids)``: contiguous ranges, with
    ``ipp = num_ids // N`` and ``extras = num_ids % N``, shard
    ``max(key // (ipp + 1), (key - extras) // ipp)`` (the first ``extras`` shards hold one id
    more). A key outside the range is an error naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from evdb._types import Int64Array
from evdb.errors import ConfigError, InvalidArgumentError

__all__ = ["PLACEMENTS", "Placement", "fmix64"]

PlacementKind = Literal["hash", "mod", "div"]
PLACEMENTS = ("hash", "mod", "div")
DEFAULT_BUCKETS = 1024

_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)


def fmix64(keys: Int64Array) -> np.ndarray:
    """murmur3's 64-bit finaliser of each key's bits: (n,) uint64."""
    h = np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64).copy()
    with np.errstate(over="ignore"):  # multiplication mod 2^64 is the point
        h ^= h >> np.uint64(33)
        h *= _C1
        h ^= h >> np.uint64(33)
        h *= _C2
        h ^= h >> np.uint64(33)
    return h


@dataclass(frozen=True)
class Placement:
    """How a sharded table's keys are spread over its ranks; see the module docstring.

    Parameters
    ----------
    kind : "hash" | "mod" | "div"
    buckets : int
        Virtual buckets of ``"hash"`` (at least one per shard); fixed for the table's life.
    num_ids : int, optional
        The id space ``[0, num_ids)`` of ``"div"`` (required there, unused otherwise).

    Examples
    --------
    >>> import numpy as np
    >>> Placement("mod").owners(np.array([0, 1, 2, 3, -1]), 2).tolist()
    [0, 1, 0, 1, 1]
    >>> Placement("div", num_ids=10).owners(np.arange(10), 3).tolist()
    [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    """

    kind: PlacementKind = "hash"
    buckets: int = DEFAULT_BUCKETS
    num_ids: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in PLACEMENTS:
            raise ConfigError(f"placement must be one of {list(PLACEMENTS)}, got {self.kind!r}")
        for name, value in (("buckets", self.buckets), ("num_ids", self.num_ids)):
            if value is None and name == "num_ids":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        if self.kind == "div" and self.num_ids is None:
            raise ConfigError("num_ids: placement 'div' needs the id space [0, num_ids)")

    def check(self, n_shards: int) -> None:
        """Raise ``ConfigError`` if this placement cannot spread over n_shards ranks."""
        if self.kind == "hash" and self.buckets < n_shards:
            raise ConfigError(
                f"buckets: {self.buckets} hash buckets cannot be spread over {n_shards} shards; "
                "give at least one per shard"
            )
        if self.kind == "div" and self.num_ids is not None and self.num_ids < n_shards:
            raise ConfigError(
                f"num_ids: {self.num_ids} ids cannot be divided over {n_shards} shards"
            )

    def bucket_starts(self, n_shards: int) -> Int64Array:
        """(n_shards + 1,) int64: rank r owns hash buckets [starts[r], starts[r + 1])."""
        return np.arange(n_shards + 1, dtype=np.int64) * self.buckets // n_shards

    def buckets_of(self, keys: Int64Array) -> Int64Array:
        """(n,) int64: each key's hash bucket."""
        return (fmix64(keys) % np.uint64(self.buckets)).astype(np.int64)

    def owners(self, keys: Int64Array, n_shards: int, *, arg: str = "keys") -> Int64Array:
        """(n,) int64: the rank that owns each key, among n_shards."""
        self.check(n_shards)
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        if self.kind == "hash":
            starts = self.bucket_starts(n_shards)
            return np.searchsorted(starts, self.buckets_of(keys), side="right") - 1
        if self.kind == "mod":
            return np.mod(keys, n_shards)
        assert self.num_ids is not None
        bad = np.flatnonzero((keys < 0) | (keys >= self.num_ids))
        if bad.size:
            i = int(bad[0])
            raise InvalidArgumentError(
                f"{arg}[{i}] = {int(keys[i])} is outside the 'div' placement's id space "
                f"[0, {self.num_ids})"
            )
        ipp, extras = divmod(self.num_ids, n_shards)
        return np.maximum(keys // (ipp + 1), (keys - extras) // ipp)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "buckets": self.buckets, "num_ids": self.num_ids}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Placement:
        return cls(
            d["kind"], int(d["buckets"]), None if d["num_ids"] is None else int(d["num_ids"])
        )


def parse_placement(placement: Any, buckets: int | None, num_ids: int | None) -> Placement:
    """``create_table``'s placement arguments as a ``Placement``."""
    if isinstance(placement, Placement):
        if buckets is not None or num_ids is not None:
            raise ConfigError("pass buckets= and num_ids= inside the Placement, not beside it")
        return placement
    if not isinstance(placement, str):
        raise ConfigError(f"placement must be one of {list(PLACEMENTS)}, got {placement!r}")
    return Placement(
        placement,  # type: ignore[arg-type]  # checked in __post_init__
        DEFAULT_BUCKETS if buckets is None else buckets,
        num_ids,
    )
