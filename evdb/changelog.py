"""A table's bounded log of what changed since its last publication (``evdb.publish``).

Two key logs, fed by ``Table`` (``touched``: the keys whose row version rose, by ``pull``,
``push`` and ``upsert``) and by the tier chain (``removed``: the keys whose rows left every
tier for good: ``delete``, ``compact()``, TTL expiry, L2 pruning, eviction without a disk
tier). A publication reads the current rows of the touched keys, so a delta costs what
changed, never a scan of the table.

The logs record nothing until a publication starts them (a database that never publishes
pays one attribute test per write). They are bounded: appends go to a list of arrays, which is
deduplicated when it passes the bound (and twice its last distinct count: at most 2x the bound
is held); if the distinct keys still exceed it, the log is
dropped and marked ``overflowed``, which makes the next publication a full one. Every
overflow and every key dropped with it is counted (``stats``). A log is emptied only after a
publication is durable (``clear``): a failed publication leaves it whole for the next try.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evdb._types import Int64Array

__all__ = ["DEFAULT_MAX_KEYS", "ChangeLog"]

DEFAULT_MAX_KEYS = 1 << 22  # distinct keys per log: 32 MiB of int64, ~40 s of 10^5 keys/step


class _KeyLog:
    """Appended int64 keys, deduplicated lazily; ``None`` entries never appear."""

    def __init__(self) -> None:
        self.parts: list[Int64Array] = []
        self.n = 0  # keys held (an upper bound of the distinct ones)
        self.distinct_n = 0  # distinct keys at the last dedup

    def append(self, keys: Int64Array) -> None:
        self.parts.append(np.array(keys, dtype=np.int64, copy=True))  # callers reuse buffers
        self.n += keys.shape[0]

    def distinct(self) -> Int64Array:
        if not self.parts:
            return np.empty(0, dtype=np.int64)
        keys = np.unique(np.concatenate(self.parts))
        self.parts, self.n, self.distinct_n = [keys], keys.shape[0], keys.shape[0]
        return keys

    def clear(self) -> None:
        self.parts, self.n, self.distinct_n = [], 0, 0


class ChangeLog:
    """The touched and removed keys of one table since its last publication.

    Parameters
    ----------
    max_keys : int
        The most distinct keys each log holds before it overflows.

    Examples
    --------
    >>> import numpy as np
    >>> log = ChangeLog(max_keys=4)
    >>> log.touched(np.array([1, 2]))          # not started: nothing is recorded
    >>> log.start(); log.touched(np.array([3, 3, 5])); log.removed(np.array([2]))
    >>> log.pending()[0].tolist(), log.pending()[1].tolist()
    ([3, 5], [2])
    >>> log.touched(np.arange(10, 20)); log.settle(); log.overflowed, log.stats()["overflows"]
    (True, 1)
    """

    def __init__(self, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.max_keys = max_keys
        self.active = False
        self.overflowed = False
        self._touched = _KeyLog()
        self._removed = _KeyLog()
        self.overflows = 0  # times a log overflowed (each forced a full publication)
        self.dropped_keys = 0  # keys dropped by those overflows (a full carried them)

    def start(self) -> None:
        """Record from now on (after a publication); keeps nothing from before."""
        self.active = True
        self.clear()

    def stop(self) -> None:
        self.active = False
        self.clear()

    def touched(self, keys: Int64Array) -> None:
        """Keys (n,) int64 whose rows' version rose."""
        if self.active and not self.overflowed and keys.shape[0]:
            self._touched.append(keys)
            self._check(self._touched)

    def removed(self, keys: Int64Array) -> None:
        """Keys (n,) int64 whose rows left every tier for good."""
        if self.active and not self.overflowed and keys.shape[0]:
            self._removed.append(keys)
            self._check(self._removed)

    def _check(self, log: _KeyLog) -> None:
        # Deduplicate once the log holds twice what it held distinct at its last dedup (and
        # more than max_keys): amortised, however close to the bound the distinct keys are.
        if log.n <= max(self.max_keys, 2 * log.distinct_n):
            return
        if log.distinct().shape[0] <= self.max_keys:
            return
        # Too many distinct keys to publish as a delta: the next publication is a full one,
        # so what is dropped here is counted, not lost.
        self.dropped_keys += self._touched.n + self._removed.n
        self.overflows += 1
        self.overflowed = True
        self._touched.clear()
        self._removed.clear()

    def settle(self) -> None:
        """Check the bound now (appends check it lazily): overflow if either log holds more
        than ``max_keys`` distinct keys. A publication calls it first."""
        for log in (self._touched, self._removed):
            if self.active and not self.overflowed and log.n > self.max_keys:
                log.distinct_n = 0  # force the dedup
                self._check(log)

    def pending(self) -> tuple[Int64Array, Int64Array]:
        """(touched (m,), removed (r,)): distinct, sorted int64 keys; the log is unchanged."""
        return self._touched.distinct(), self._removed.distinct()

    def clear(self) -> None:
        """Forget what was recorded: a publication holding it is durable."""
        self._touched.clear()
        self._removed.clear()
        self.overflowed = False

    def stats(self) -> dict[str, Any]:
        return {
            "recording": self.active,
            "pending_touched": self._touched.n,
            "pending_removed": self._removed.n,
            "overflowed": self.overflowed,
            "overflows": self.overflows,
            "dropped_keys": self.dropped_keys,
        }
