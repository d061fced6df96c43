"""HashIndex against a dict, through growth: while the next table is prepared and while a move
to it is in progress (a few old slots per call), every key stays findable with its row,
removals and re-inserts included; the fused read kernels' view (``slots``) is one table."""

from __future__ import annotations

import numpy as np
import pytest

from evdb import hashindex
from evdb.hashindex import HashIndex


@pytest.mark.parametrize("move_slots", [1, 7, 256, 1 << 16])
def test_index_equals_a_dict_while_growing(
    monkeypatch: pytest.MonkeyPatch, move_slots: int
) -> None:
    monkeypatch.setattr(hashindex, "MOVE_SLOTS", move_slots)
    rng = np.random.default_rng(move_slots)
    index, model = HashIndex(), {}
    next_row, moves_seen, prepared_seen = 0, 0, 0
    for _ in range(400):
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
        moves_seen += index._old is not None
        prepared_seen += index._next is not None  # the next table being marked empty
        probe = np.concatenate(
            [np.array(list(model), dtype=np.int64), rng.integers(9000, 9100, 20)]
        )
        assert index.find(probe).tolist() == [model.get(k, -1) for k in probe.tolist()]
        assert index.size == len(model)
    if move_slots < 1 << 16:
        assert moves_seen > 0  # the moves were in progress across calls
    assert prepared_seen > 0
    slots = index.slots  # one table for the fused kernels: every key in it, no move pending
    assert index._old is None
    assert sorted(slots[slots[:, 1] >= 0, 0].tolist()) == sorted(model)
    assert sorted(index.live_rows().tolist()) == sorted(model.values())
