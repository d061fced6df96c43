"""Training-loop misuse is an error or is counted, never silent.

An update is tied to its pull: a ``Pulled`` is pushed once, while it is its table's latest
pull. Before this (git 44adbbf) a second push applied the gradient twice, a push of an older
batch after a newer pull was applied, a pull never pushed left no trace in ``stats()``, and a
table with a TTL whose loop never advanced the step said nothing.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import evdb
from evdb.errors import InvalidArgumentError


@pytest.fixture
def db(tmp_path: Path):
    d = evdb.open(tmp_path / "db")
    yield d
    d.close()


def _ones(p: evdb.Pulled, dim: int = 2) -> np.ndarray:
    return np.ones((p.keys.shape[0], dim), dtype=np.float32)


def test_pushing_the_same_pulled_twice_raises_and_changes_nothing(db) -> None:
    t = db.create_table("t", dim=2, initializer=evdb.init.Zeros())
    p = t.pull([1, 2])
    t.push(p, _ones(p))
    before = t.lookup([1, 2]).copy()
    with pytest.raises(InvalidArgumentError, match="pushed already"):
        t.push(p, _ones(p))
    np.testing.assert_array_equal(t.lookup([1, 2]), before)
    assert t.stats()["pushes"] == 1


def test_pushing_an_older_pulled_after_a_newer_pull_raises_and_changes_nothing(db) -> None:
    t = db.create_table("t", dim=2, initializer=evdb.init.Zeros())
    old = t.pull([1, 2])
    new = t.pull([2, 3])
    with pytest.raises(InvalidArgumentError, match="stale"):
        t.push(old, _ones(old))
    np.testing.assert_array_equal(t.lookup([1, 2, 3]), np.zeros((3, 2)))
    t.push(new, _ones(new))  # the latest batch still pushes
    assert t.lookup([3])[0, 0] != 0.0
    with pytest.raises(InvalidArgumentError, match="pushed already"):
        t.push(old, _ones(old))  # older than the last push: never again


def test_a_failed_push_can_be_retried(db) -> None:
    t = db.create_table("t", dim=2)
    p = t.pull([1])
    with pytest.raises(InvalidArgumentError):
        t.push(p, [[np.nan, 0.0]])
    t.push(p, _ones(p))  # the bad gradients changed nothing, the batch is still pushable
    assert t.stats()["pushes"] == 1


def test_pulled_of_a_recreated_table_is_refused(db) -> None:
    t = db.create_table("t", dim=2)
    p = t.pull([1])
    db.drop_table("t")
    t2 = db.create_table("t", dim=2)
    t2.pull([1])
    with pytest.raises(InvalidArgumentError, match="another table"):
        t2.push(p, _ones(p))


def test_pulls_never_pushed_are_counted_and_persist(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=2)
        assert t.stats()["pulls_not_pushed"] == 0
        t.pull([1])  # never pushed...
        t.pull([2])  # ... which this pull finds
        p = t.pull([3])
        t.push(p, _ones(p))
        t.pull([4])  # pushed before it: not counted
        assert t.stats()["pulls_not_pushed"] == 2
    with evdb.open(tmp_path / "db") as db:
        assert db.table("t").stats()["pulls_not_pushed"] == 2


def test_ttl_table_warns_once_when_pushes_pile_up_at_one_step(db) -> None:
    t = db.create_table("t", dim=2, ttl_steps=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(1000):
            p = t.pull([1])
            t.push(p, _ones(p))
    relevant = [w for w in caught if "db.advance()" in str(w.message)]
    assert len(relevant) == 1 and relevant[0].category is RuntimeWarning
    assert "ttl_steps=3" in str(relevant[0].message)
    with warnings.catch_warnings(record=True) as caught:  # once per table
        warnings.simplefilter("always")
        for _ in range(1000):
            p = t.pull([1])
            t.push(p, _ones(p))
    assert not [w for w in caught if "db.advance()" in str(w.message)]


def test_a_loop_that_advances_does_not_warn(db) -> None:
    t = db.create_table("t", dim=2, ttl_steps=3)
    u = db.create_table("u", dim=2)  # no TTL: nothing to warn about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(1000):
            p = t.pull([1])
            t.push(p, _ones(p))
            q = u.pull([1])
            u.push(q, _ones(q))
            db.advance()
