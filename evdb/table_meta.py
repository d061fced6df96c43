"""What a table records about itself beside its rows: its version, its pushes, the uid of its
incarnation and the counts of what its policies dropped.

``Table`` owns one ``TableMeta``; the database saves it (``to_arrays``) in its metadata, a
checkpoint manifest names the uid and version, and resharding merges the metas of the old
shards into the new ones (``merged``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["COUNTERS", "TableMeta"]

# The order of the saved counters after the first four; a counter added later goes last, so
# that an older save still loads (its missing counters start at 0).
COUNTERS = (
    "not_admitted",
    "expired_on_pull",
    "dropped_gradients",
    "frozen_gradients",
    "pulls_not_pushed",  # pulls whose batch the next pull found not pushed
)


def _zeros() -> dict[str, int]:
    return dict.fromkeys(COUNTERS, 0)


@dataclass
class TableMeta:
    """A table's version, pushes, uid and policy counters.

    ``version`` is the table-wide mutation counter: every row records the version that last
    changed it (incremental checkpoints keep the rows above a base's). ``pushes`` counts
    optimizer steps (Adam's bias correction). ``uid`` names this incarnation of the table:
    versions restart when a table is re-created, and must not be compared across them.
    """

    version: int = 0
    pushes: int = 0
    uid: str = field(default_factory=lambda: os.urandom(8).hex())
    counters: dict[str, int] = field(default_factory=_zeros)

    def bump(self) -> int:
        """The next version (a mutation is about to stamp its rows with it)."""
        self.version += 1
        return self.version

    def count(self, name: str, n: int) -> None:
        self.counters[name] += n

    def to_arrays(self, evictions: tuple[int, int]) -> dict[str, np.ndarray]:
        """The saved form: ``counters`` = [version, pushes, evictions, expired evictions,
        *COUNTERS] (the tier's two eviction counts ride along, where older saves put them)
        and ``uid`` as 8 bytes."""
        head = [self.version, self.pushes, *evictions]
        return {
            "counters": np.array(head + [self.counters[c] for c in COUNTERS], dtype=np.int64),
            "uid": np.frombuffer(bytes.fromhex(self.uid), dtype=np.uint8),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> tuple[TableMeta, tuple[int, int]]:
        """What ``to_arrays`` saved: the meta and the tier's eviction counts."""
        c = [int(x) for x in arrays["counters"].tolist()]
        saved = c[4:] + [0] * (len(COUNTERS) - len(c[4:]))  # counters added later
        meta = cls(version=c[0], pushes=c[1], counters=dict(zip(COUNTERS, saved, strict=True)))
        if "uid" in arrays:
            meta.uid = arrays["uid"].tobytes().hex()
        return meta, (c[2], c[3])

    def merged(self, olds: Sequence[TableMeta], *, with_counters: bool) -> TableMeta:
        """This (new) table's meta after taking rows from the tables ``olds`` (resharding):
        the pushes of the old job (every shard took each push), the highest version (rows keep
        theirs), this uid, and with ``with_counters`` the old counters summed (one new shard
        carries them, so that their totals stay)."""
        counters = dict(self.counters)
        if with_counters:
            counters = {c: sum(o.counters[c] for o in olds) for c in COUNTERS}
        return TableMeta(
            version=max([self.version, *(o.version for o in olds)]),
            pushes=olds[0].pushes if olds else self.pushes,
            uid=self.uid,
            counters=counters,
        )

    def copy(self) -> TableMeta:
        return TableMeta(self.version, self.pushes, self.uid, dict(self.counters))
