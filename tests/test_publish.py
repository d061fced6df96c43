"""``Database.publish``: full and delta publications, the change logs, crashes, retention.

What a follower makes of a root (values equal to the trainer's, faults refused) is in
``tests/api/test_follow.py``; here, the root itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import evdb
from evdb import checkpoint as _checkpoint
from evdb import publish as _publish
from evdb.tiers.chain import TierChain
from evdb.tiers.rocks import RocksTier


def _delta(root: Path, seq: int, table: str) -> dict[str, np.ndarray]:
    with np.load(_publish.publication_dir(root, seq) / f"{table}.npz") as z:
        return {k: z[k] for k in z.files}


def test_first_is_full_then_deltas_of_what_changed(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=4)
        t.upsert(np.arange(100), np.ones((100, 4), np.float32))
        first = db.publish(root)
        assert (first["seq"], first["kind"], first["rows"]) == (1, "full", 100)
        assert "first" in first["reason"]
        t.upsert([3, 500], np.full((2, 4), 2.0, np.float32))
        p = t.pull([7, 8])
        t.push(p, np.ones((2, 4), np.float32))
        assert t.delete([9, 10_000]) == 1
        second = db.publish(root)
        assert (second["seq"], second["kind"], second["rows"], second["deleted"]) == (
            2,
            "delta",
            4,
            1,
        )
        d = _delta(root, 2, "item")
        assert d["keys"].tolist() == [3, 7, 8, 500]
        assert d["removed"].tolist() == [9]
        np.testing.assert_array_equal(d["values"], t.lookup(d["keys"]))
        third = db.publish(root)  # nothing changed: an empty delta, still a new seq
        assert (third["seq"], third["kind"], third["rows"], third["deleted"]) == (3, "delta", 0, 0)
        assert db.publish(root, full=True)["kind"] == "full"
    head = _publish.read_head(root)
    assert head is not None and (head["seq"], head["full"]) == (4, 4)
    manifest = _checkpoint.verify(_publish.publication_dir(root, 3))
    entry = manifest["publication"]
    assert (entry["parent"], entry["full"], entry["kind"]) == (2, 1, "delta")
    assert entry["parent_manifest"] == _checkpoint.file_digest(
        _publish.publication_dir(root, 2) / "MANIFEST.json"
    )


def test_a_full_publication_is_a_serving_snapshot_keeping_ttl(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=3, ttl_steps=4, dram_rows=50)  # rows spill to disk
        t.upsert(np.arange(60), np.ones((60, 3), np.float32))
        db.advance(3)
        t.upsert(np.arange(60, 120), np.full((60, 3), 2.0, np.float32))
        db.publish(root)
        want = t.lookup(np.arange(130))
    path = _publish.publication_dir(root, 1)
    with evdb.open(path, read_only=True) as snap:
        served = snap.table("item")
        assert served.config.ttl_steps == 4 and len(served) == 120
        np.testing.assert_array_equal(served.lookup(np.arange(130)), want)
        # the rows written at step 0 expire at step 5, as trained
        assert served.contains([0, 59, 60], step=5).tolist() == [False, False, True]


def test_a_delta_reads_no_scan_and_is_a_sliver_of_the_full(tmp_path: Path, monkeypatch) -> None:
    # The 1,000 of 1,000,000 rows, at a tenth of the size (a 2-core machine): 100
    # of 100,000, dim 16, whose full snapshot holds about 8 MB.
    n, touched = 100_000, 100
    root = tmp_path / "pub"
    rng = np.random.default_rng(0)
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=16, dram_rows=20_000)
        t.upsert(np.arange(n), rng.normal(size=(n, 16)).astype(np.float32))
        full = db.publish(root)
        t.upsert(rng.choice(n, touched, replace=False), np.zeros((touched, 16), np.float32))

        def no_scan(*args, **kwargs):
            raise AssertionError("a delta must not scan the table")

        monkeypatch.setattr(RocksTier, "scan", no_scan)
        monkeypatch.setattr(TierChain, "scan", no_scan)
        delta = db.publish(root)
    assert delta["kind"] == "delta" and delta["rows"] == touched
    assert delta["bytes"] <= 0.01 * full["bytes"], (delta["bytes"], full["bytes"])


def test_every_removal_reaches_the_delta(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        ttl = db.create_table("ttl", dim=2, ttl_steps=2, l2_threshold=0.5, dram_rows=20)
        ttl.upsert(np.arange(40), np.ones((40, 2), np.float32))  # spills to disk
        ttl.upsert([100, 101], np.full((2, 2), 0.1, np.float32))  # under the L2 threshold
        small = db.create_table("small", dim=2, dram_rows=10, disk=False)
        small.upsert(np.arange(10), np.ones((10, 2), np.float32))
        db.publish(root)
        ttl.delete([0])
        db.advance(3)
        ttl.upsert([1], np.ones((1, 2), np.float32))  # expired, re-created: a row, not removed
        assert ttl.compact() == {"expired": 40, "l2": 0, "admission_forgotten": 0}
        small.upsert(np.arange(10, 15), np.ones((5, 2), np.float32))  # evicts 5 for good
        result = db.publish(root)
        assert result["kind"] == "delta"
        d = _delta(root, 2, "ttl")
        assert d["keys"].tolist() == [1]
        assert d["removed"].tolist() == sorted(set(range(40)) - {1} | {100, 101})
        d = _delta(root, 2, "small")
        gone = d["removed"]  # the victims, down to the low watermark
        assert len(gone) >= 5 and len(small) + len(gone) == 15
        assert not small.contains(gone).any() and small.contains(d["keys"]).all()
        assert set(d["keys"].tolist()) | set(gone.tolist()) >= set(range(10, 15))
        db.advance(1)
        ttl.upsert([200], np.ones((1, 2), np.float32))
        ttl.upsert([201], np.full((1, 2), 0.1, np.float32))
        assert ttl.compact()["l2"] == 1  # L2 pruning
        db.publish(root)
        assert _delta(root, 3, "ttl")["removed"].tolist() == [201]


def test_an_overflowing_log_makes_the_next_publication_full_and_counts(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=2)
        db.publish(root)
        t.changes.max_keys = 50
        t.upsert(np.arange(40), np.ones((40, 2), np.float32))
        t.upsert(np.arange(40), np.ones((40, 2), np.float32))  # duplicates do not overflow
        assert not t.changes.overflowed
        t.upsert(np.arange(40, 60), np.ones((20, 2), np.float32))  # 60 distinct: over 50
        with pytest.raises(evdb.InvalidArgumentError, match="overflowed"):
            db.publish(root, full=False)
        log = t.stats()["changelog"]
        assert log["overflowed"] and log["overflows"] == 1 and log["dropped_keys"] == 60
        result = db.publish(root)
        assert result["kind"] == "full" and "overflowed" in result["reason"]
        assert result["rows"] == 60
        t.upsert([1], np.ones((1, 2), np.float32))
        assert db.publish(root)["kind"] == "delta"


def test_a_failed_publication_loses_nothing(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=2)
        db.publish(root)
        t.upsert([1, 2], np.ones((2, 2), np.float32))

        def crash(*args, **kwargs):
            raise OSError("disk full")

        with monkeypatch.context() as m:
            m.setattr(_checkpoint, "finish_dir", crash)
            with pytest.raises(OSError):
                db.publish(root)
        assert _publish.read_head(root)["seq"] == 1  # the root still reads as before
        assert sorted(p.name for p in root.iterdir()) == [".lock", "000000000001", "HEAD"]
        t.upsert([3], np.ones((1, 2), np.float32))
        result = db.publish(root)
        assert (result["seq"], result["kind"], result["rows"]) == (2, "delta", 3)


def test_a_crash_before_head_leaves_the_previous_head(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=2)
        db.publish(root)
        # what a crash leaves: a half-built directory, and a renamed one HEAD never named
        (root / ".000000000002.tmp-999").mkdir()
        (root / "000000000002").mkdir()
        assert _publish.read_head(root)["seq"] == 1
        t.upsert([1], np.ones((1, 2), np.float32))
        result = db.publish(root)
        assert (result["seq"], result["kind"], result["rows"]) == (2, "delta", 1)
        manifest = _checkpoint.verify(_publish.publication_dir(root, 2))
        assert manifest["publication"]["seq"] == 2
        assert not (root / ".000000000002.tmp-999").exists()


def test_retention_keeps_the_newest_fulls(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=2)
        kinds = []
        for i in range(7):
            t.upsert([i], np.ones((1, 2), np.float32))
            kinds.append(db.publish(root, full=i in (0, 3, 5), keep=2)["kind"])
    assert kinds == ["full", "delta", "delta", "full", "delta", "full", "delta"]
    assert _publish.list_publications(root) == [4, 5, 6, 7]


def test_a_restarted_trainer_publishes_a_full_first(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        db.create_table("item", dim=2).upsert([1], [[1.0, 1.0]])
        db.publish(root)
    with evdb.open(tmp_path / "db") as db:
        result = db.publish(root)
        assert result["kind"] == "full" and result["seq"] == 2
        db.create_table("other", dim=2)
        assert "created or dropped" in db.publish(root)["reason"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"full": "yes"}, "full must be"), ({"keep": 0}, "keep must be"), ({"keep": 1.5}, "keep")],
)
def test_bad_arguments_change_nothing(tmp_path: Path, kwargs, match) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        db.create_table("item", dim=2)
        with pytest.raises(evdb.InvalidArgumentError, match=match):
            db.publish(root, **kwargs)
    assert not root.exists()


def test_read_only_databases_cannot_publish(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        db.create_table("item", dim=2)
    with evdb.open(tmp_path / "db", read_only=True) as db:
        with pytest.raises(evdb.ReadOnlyError):
            db.publish(tmp_path / "pub")
    head = tmp_path / "HEAD"
    head.write_text(json.dumps({"format": "other"}))
    with pytest.raises(evdb.CorruptDataError, match="HEAD"):
        _publish.read_head(tmp_path)


def test_restored_records_reach_the_next_delta(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        a = db.create_table("a", dim=2)
        b = db.create_table("b", dim=2)
        a.upsert([1, 2], [[1.0, 1.0], [2.0, 2.0]])
        db.publish(root)
        _, records = a.read_records(np.array([1, 2]))
        b.restore_records(np.array([1, 2]), records)  # as resharding moves rows
        assert db.publish(root)["kind"] == "delta"
        assert _delta(root, 2, "b")["keys"].tolist() == [1, 2]


@pytest.mark.parametrize("damage", ["no removed array", "values of another dim"])
def test_a_delta_file_a_writer_got_wrong_is_corrupt_naming_it(tmp_path: Path, damage) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=4)
        t.upsert(np.arange(10), np.ones((10, 4), np.float32))
        db.publish(root)
        t.upsert([3], np.full((1, 4), 2.0, np.float32))
        db.publish(root)
    manifest = _checkpoint.verify(_publish.publication_dir(root, 2))
    path = _publish.publication_dir(root, 2) / "item.npz"
    arrays = _delta(root, 2, "item")
    if damage == "no removed array":
        del arrays["removed"]
    else:
        arrays["values"] = np.ones(5, np.float32)
    np.savez(path, **arrays)
    with pytest.raises(evdb.CorruptDataError, match=r"item\.npz"):
        _publish.load_delta(root, 2, manifest)
