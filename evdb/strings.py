"""``StringKeeper``: the original strings of a table created with ``keep_strings=True``.

A str table hashes each string to an int64 key (xxh3-64). Keeping the strings lets exports
write tokens back (word2vec), and lets the table catch the collision that a plain hashed store
cannot see: two different strings with one hash raise ``KeyCollisionError`` before anything
changes, instead of sharing a row. Strings arrive as Python objects, so this module works per
string (as the hashing itself does); the rows' numbers never pass through it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from evdb._types import BoolArray, Int64Array
from evdb.errors import KeyCollisionError
from evdb.tiers.rocks import RocksStrings

__all__ = ["StringKeeper"]

NewStrings = tuple[Int64Array, list[str]]


class StringKeeper:
    """The strings of one table, stored in RocksDB, checked at every write of a key."""

    def __init__(self, stored: RocksStrings) -> None:
        self.stored = stored
        self._batch: tuple[Int64Array, list[Any]] | None = None

    def remember(self, hashed: Int64Array, given: Any) -> None:
        """Keep the strings behind the keys a call was given (none for pre-hashed keys)."""
        if isinstance(given, np.ndarray) and given.dtype.kind in "iu":
            self._batch = None
        else:
            self._batch = (hashed, given.tolist() if isinstance(given, np.ndarray) else list(given))

    def check(self, uniq: Int64Array) -> NewStrings | None:
        """The strings of the distinct keys of the last call, checked against each other and
        against the stored ones (a mismatch raises before anything changes); returns the keys
        whose string is not stored yet, with their strings."""
        if self._batch is None:
            return None
        hashed, given = self._batch
        by_key: dict[int, str] = {}
        for h, s in zip(hashed.tolist(), given, strict=True):
            if by_key.setdefault(h, s) != s:
                raise KeyCollisionError(
                    f"keys: {by_key[h]!r} and {s!r} hash to the same key {h}; a table that "
                    "keeps its strings never merges two strings into one row"
                )
        mine = [by_key[k] for k in uniq.tolist()]
        stored = self.stored.get(uniq)
        for k, s, t in zip(uniq.tolist(), mine, stored, strict=True):
            if t is not None and t != s:
                raise KeyCollisionError(
                    f"keys: {s!r} hashes to key {k}, which already holds {t!r}; a table "
                    "that keeps its strings never merges two strings into one row"
                )
        new = [i for i, t in enumerate(stored) if t is None]
        return uniq[new], [mine[i] for i in new]

    def store(self, new: NewStrings | None, with_rows: Int64Array) -> None:
        """Store the strings of the keys among ``new`` that now have a row."""
        if new is None or new[0].shape[0] == 0:
            return
        keys, strings = new
        has_row = np.isin(keys, with_rows)
        if has_row.any():
            self.stored.put(keys[has_row], list(itertools.compress(strings, has_row)))

    def get(self, keys: Int64Array) -> list[str | None]:
        return self.stored.get(keys)

    def remove(self, keys: Int64Array) -> None:
        self.stored.remove(keys)

    def drop_orphans(self, has_row: Callable[[Int64Array], BoolArray]) -> None:
        """Remove the strings of keys that no longer have a row (rows dropped by eviction
        without a disk tier, by expiry or by compaction leave their strings behind)."""
        for keys in self.stored.scan_keys(65536):
            orphans = keys[~has_row(keys)]
            if orphans.shape[0]:
                self.stored.remove(orphans)
