"""HashIndex against a dict, through growth: while a move to a larger table is in progress
(a few old slots per call, the moved-out part of the old table given back to the system),
every key stays findable with its row, removals and re-inserts included; the fused read
kernels' view (``slots``) is one table. The host (pairs) and device (wide) layouts both."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from evdb import hashindex
from evdb.errors import CapacityError
from evdb.hashindex import MAX_LOAD, HashIndex, empty_slots, index_bytes
from evdb.kernels import backend
from evdb.kernels.reference.index import slot_keys, slot_rows

# numpy under another name: HashIndex then keeps the device tier's wide layout
NOT_NUMPY = SimpleNamespace(**{n: getattr(np, n) for n in dir(np) if not n.startswith("__")})


def _exercise(index: HashIndex, rng: np.random.Generator, steps: int) -> tuple[dict[int, int], int]:
    model: dict[int, int] = {}
    next_row, moves_seen = 0, 0
    for _ in range(steps):
        op = rng.random()
        if op < 0.6:  # insert a batch of new keys (some clustered, some spread)
            pool = rng.integers(-(2**63), 2**63 - 1, 200, dtype=np.int64)
            pool[:50] = rng.integers(0, 3000, 50)
            new = np.unique(pool[[k not in model for k in pool.tolist()]])
            rows = np.arange(next_row, next_row + new.shape[0], dtype=np.int64)
            next_row += new.shape[0]
            index.insert(new, rows)
            model.update(zip(new.tolist(), rows.tolist(), strict=True))
        elif op < 0.75 and model:  # remove some keys, and some that are absent
            have = np.array(list(model), dtype=np.int64)
            gone = np.concatenate([rng.choice(have, min(30, have.shape[0]), replace=False),
                                   rng.integers(5000, 6000, 5)])  # fmt: skip
            got = index.remove(gone)
            want = [model.pop(k, -1) for k in gone.tolist()]
            assert got.tolist() == want
        moves_seen += index.moving
        probe = np.concatenate(
            [np.array(list(model), dtype=np.int64), rng.integers(9000, 9100, 20)]
        )
        assert index.find(probe).tolist() == [model.get(k, -1) for k in probe.tolist()]
        assert index.size == len(model)
    return model, moves_seen


@pytest.mark.parametrize(
    ("xp", "move_slots"),
    [(np, 1), (np, 7), (np, 256), (np, 1 << 16), (NOT_NUMPY, 7), (NOT_NUMPY, 1 << 16)],
)
def test_index_equals_a_dict_while_growing(
    monkeypatch: pytest.MonkeyPatch, move_slots: int, xp: Any
) -> None:
    monkeypatch.setattr(hashindex, "MOVE_SLOTS", move_slots)
    monkeypatch.setattr(hashindex, "MOVE_PER_KEY", 0 if move_slots < 256 else 4)
    index = HashIndex(xp=xp)
    model, moves_seen = _exercise(index, np.random.default_rng(move_slots), 300)
    if move_slots < 1 << 16:
        assert moves_seen > 0  # the moves were in progress across calls
    slots = index.slots  # one table for the fused kernels: every key in it, no move pending
    assert not index.moving
    assert slots.shape[1] == (3 if xp is np else 2)
    rows = slot_rows(slots)
    assert sorted(slot_keys(slots)[rows >= 0].tolist()) == sorted(model)
    assert sorted(index.live_rows().tolist()) == sorted(model.values())
    assert index.size <= MAX_LOAD * (2 * slots.shape[0] if xp is np else slots.shape[0])


def test_a_move_gives_the_old_tables_moved_part_back_and_keeps_every_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 700k keys: the last old tables (8-11 MB) span whole 2 MiB units to give back
    monkeypatch.setattr(hashindex, "MOVE_SLOTS", 1 << 16)
    monkeypatch.setattr(hashindex, "MOVE_PER_KEY", 0)
    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(-(2**63), 2**63 - 1, 700_000, dtype=np.int64))
    rng.shuffle(keys)
    index = HashIndex()
    batch, released_seen, start = 20_000, 0, 0
    while start < keys.shape[0]:
        index.insert(
            keys[start : start + batch],
            np.arange(start, start + batch)[: keys[start : start + batch].shape[0]],
        )
        start += batch
        if index.moving:
            assert index._old is not None
            released_seen = max(released_seen, index._released)
            assert index.nbytes == index._table.nbytes + index._old.nbytes - index._released
        got = index.find(np.concatenate([keys[:start], keys[start:][:1000] ^ 1]))
        np.testing.assert_array_equal(got[:start], np.arange(start))
    if hashindex._madvise is not None:
        assert released_seen >= 2 << 20
    index.slots  # noqa: B018 (finishes the move)
    assert index.nbytes == index._table.nbytes


def test_an_index_sized_up_front_holds_its_keys_under_max_load() -> None:
    cpu = backend("cpu")
    for n in (1, 1000, 123_457):
        slots = empty_slots(n)
        assert slots.nbytes == index_bytes(n) and n <= MAX_LOAD * 2 * slots.shape[0]
        keys = np.arange(n, dtype=np.int64) * 7919
        cpu.hash_insert(slots, keys, np.arange(n, dtype=np.int64))
        out = np.empty(n, np.int64)
        cpu.hash_find(slots, keys, out)
        np.testing.assert_array_equal(out, np.arange(n))
        index = HashIndex(n)
        index.insert(keys, np.arange(n, dtype=np.int64))
        assert index._table.shape == slots.shape  # no growth below the size asked for


def test_a_row_the_host_layout_cannot_hold_is_refused_and_changes_nothing() -> None:
    index = HashIndex()
    index.insert(np.array([1, 2], np.int64), np.array([0, 1], np.int64))
    for bad in (hashindex.MAX_ROW + 1, -1):
        with pytest.raises(CapacityError, match=rf"rows\[1\] = {bad}"):
            index.insert(np.array([3, 4], np.int64), np.array([2, bad], np.int64))
    assert index.size == 2
    assert index.find(np.array([1, 2, 3], np.int64)).tolist() == [0, 1, -1]
    index.insert(np.array([3], np.int64), np.array([hashindex.MAX_ROW], np.int64))
    assert index.find(np.array([3], np.int64)).tolist() == [hashindex.MAX_ROW]
