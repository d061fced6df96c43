"""Sharded tables on torch.distributed (gloo, 127.0.0.1): N ranks equal one process on the
same global batches; checkpoints, resharding and the merged export; failures fail fast."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evdb
from evdb import distributed as evd
from tests.distributed import workers
from tests.distributed.harness import run_ranks

dist = pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch without distributed")

FIELDS = ("values", "slots", "freq", "last_step", "pending_keys", "pending_counts")


def merged(files: list[Path]) -> dict[str, dict[str, np.ndarray]]:
    """Every table's records over the shards, sorted by key."""
    parts = [dict(np.load(f)) for f in files]
    out: dict[str, dict[str, np.ndarray]] = {}
    for name in workers.table_options() | {"t": None}:
        if f"{name}.keys" not in parts[0]:
            continue
        keys = np.concatenate([p[f"{name}.keys"] for p in parts])
        order = np.argsort(keys)
        table = {"keys": keys[order]}
        for f in FIELDS[:4]:
            table[f] = np.concatenate([p[f"{name}.{f}"] for p in parts])[order]
        pk = np.concatenate([p[f"{name}.pending_keys"] for p in parts])
        po = np.argsort(pk)
        table["pending_keys"] = pk[po]
        table["pending_counts"] = np.concatenate([p[f"{name}.pending_counts"] for p in parts])[po]
        out[name] = table
    return out


def assert_same_tables(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        g, w = got[name], want[name]
        np.testing.assert_array_equal(g["keys"], w["keys"], err_msg=f"{name}: keys")
        for f in ("values", "slots"):
            np.testing.assert_allclose(g[f], w[f], rtol=1e-5, atol=1e-6, err_msg=f"{name}.{f}")
        for f in ("freq", "last_step", "pending_keys", "pending_counts"):
            np.testing.assert_array_equal(g[f], w[f], err_msg=f"{name}.{f}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("reference")
    db = workers.train_reference(root / "db")
    keys, offsets = workers.lookup_keys()
    out: dict[str, Any] = {"root": root}
    for name in db.tables():
        t = db.table(name)
        st = t.stats()
        out[name] = {
            "len": len(t),
            "not_admitted": st["admission"]["not_admitted"],
            "pending": st["admission"]["pending"],
            "dropped_gradients": st["dropped_gradients"],
            "lookup": t.lookup(keys),
            "contains": t.contains(keys),
            "bags": t.lookup(keys, offsets, combiner="sqrtn"),
        }
    workers.dump_records(db, root / "records.npz")
    out["records"] = merged([root / "records.npz"])
    evdb.export(db, root / "serving")
    db.close()
    return out


def check_run(out: Path, world: int, results: list[Any], reference: dict[str, Any]) -> None:
    assert_same_tables(merged([out / f"shard-{r}.npz" for r in range(world)]), reference["records"])
    for name in workers.table_options():
        want = reference[name]
        for r, res in enumerate(results):
            got = res[name]
            assert got["len"] == got["rows"] == want["len"], (name, r)
            for k in ("not_admitted", "pending", "dropped_gradients"):
                assert got[k] == want[k], (name, k, got[k], want[k])
            assert sum(got["shards"]) == want["len"] and len(got["shards"]) == world
            assert got["imbalance"] == pytest.approx(max(got["shards"]) * world / want["len"])
            np.testing.assert_allclose(
                np.load(out / f"bags-{name}-{r}.npy"), want["bags"], rtol=1e-5, atol=1e-6
            )
        looked = np.concatenate([np.load(out / f"lookup-{name}-{r}.npy") for r in range(world)])
        np.testing.assert_allclose(looked, want["lookup"], rtol=1e-5, atol=1e-6)
        for kind in ("found", "contains"):
            got = np.concatenate([np.load(out / f"{kind}-{name}-{r}.npy") for r in range(world)])
            np.testing.assert_array_equal(got, want["contains"])


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """3 ranks train with hash placement and take a sharded checkpoint."""
    out = tmp_path_factory.mktemp("three")
    return out, run_ranks(workers.train, 3, out, "hash", True)


def test_three_ranks_equal_one_process(three_ranks, reference) -> None:
    out, results = three_ranks
    check_run(out, 3, results, reference)
    assert all(r["step"] == workers.STEPS for r in results)


@pytest.mark.parametrize("placement", ["mod", "div"])
def test_two_ranks_equal_one_process(tmp_path: Path, placement: str, reference) -> None:
    results = run_ranks(workers.train, 2, tmp_path, placement, False)
    check_run(tmp_path, 2, results, reference)


def test_reshard_3_to_2_and_1_resumes_on_that_many_ranks(three_ranks, reference, tmp_path) -> None:
    out, _ = three_ranks
    for world in (2, 1):
        dest = tmp_path / f"ckpt-{world}"
        layout = evd.reshard(out / "ckpt", dest, world)
        assert layout["world_size"] == world and sorted(layout["checkpoint"]["shards"]) == [
            f"shard-{r:05d}" for r in range(world)
        ]
        run_out = tmp_path / f"run-{world}"
        results = run_ranks(workers.resume, world, run_out, str(dest), str(out / "ckpt"))
        assert_same_tables(
            merged([run_out / f"shard-{r}.npz" for r in range(world)]), reference["records"]
        )
        for res in results:
            assert "3 shards" in res["refused"] and "evdb reshard" in res["refused"]
            assert "restore=" in res["in_place"]
            assert res["len"] == {n: reference[n]["len"] for n in workers.table_options()}
        for r in range(world):  # resuming wrote nothing under the checkpoint
            evdb.checkpoint.verify(dest / f"shard-{r:05d}")
        assert evd.info(dest)["checkpoint"] is not None


def test_an_incremental_sharded_checkpoint_resumes_on_as_many_ranks(three_ranks, reference):
    out, _ = three_ranks
    inc = evd.info(out / "ckpt-inc")["checkpoint"]
    assert inc["kind"] == "incremental" and inc["base"] == str((out / "ckpt-base").resolve())
    with pytest.raises(evdb.InvalidArgumentError, match="incremental sharded checkpoint"):
        evd.reshard(out / "ckpt-inc", out / "never", 2)
    run_out = out / "run-incremental"
    results = run_ranks(workers.resume, 3, run_out, str(out / "ckpt-inc"), None)
    assert_same_tables(merged([run_out / f"shard-{r}.npz" for r in range(3)]), reference["records"])
    assert results[0]["len"] == {n: reference[n]["len"] for n in workers.table_options()}


def test_reshard_there_and_back_is_the_identity(three_ranks, tmp_path: Path) -> None:
    out, _ = three_ranks
    evd.reshard(out / "ckpt", tmp_path / "two", 2)
    evd.reshard(tmp_path / "two", tmp_path / "back", 3)
    for r in range(3):
        with evdb.open(out / "ckpt" / f"shard-{r:05d}", read_only=True) as a:
            workers.dump_records(a, tmp_path / f"a-{r}.npz")
        with evdb.open(tmp_path / "back" / f"shard-{r:05d}", read_only=True) as b:
            workers.dump_records(b, tmp_path / f"b-{r}.npz")
        assert_same_tables(merged([tmp_path / f"b-{r}.npz"]), merged([tmp_path / f"a-{r}.npz"]))


def test_hash_resharding_reads_only_overlapping_shards() -> None:
    p = evd.Placement("hash", buckets=12)
    from evdb.distributed.checkpoint import _overlapping

    # 3 shards own buckets [0,4) [4,8) [8,12); 2 shards [0,6) [6,12)
    assert _overlapping(p, 3, 2, 0) == [0, 1] and _overlapping(p, 3, 2, 1) == [1, 2]
    assert _overlapping(p, 2, 4, 0) == [0] and _overlapping(p, 2, 4, 3) == [1]
    assert _overlapping(evd.Placement("mod"), 3, 2, 0) == [0, 1, 2]


def test_reshard_opens_one_old_shard_at_a_time_and_only_overlapping_ones(
    three_ranks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from evdb.distributed import checkpoint as ckpt

    out, _ = three_ranks
    opened: list[str] = []
    open_now: list[str] = []
    real_open = ckpt._database.open

    class Spy:
        def __init__(self, path: Any, **kw: Any) -> None:
            self.db = real_open(path, **kw)
            self.name = Path(path).name

        def __enter__(self) -> Any:
            if self.db.read_only:
                opened.append(self.name)
                open_now.append(self.name)
                assert len(open_now) == 1, open_now  # never two old shards at once
            return self.db

        def __exit__(self, *exc: Any) -> None:
            if self.db.read_only:
                open_now.remove(self.name)
            self.db.close()

    monkeypatch.setattr(ckpt._database, "open", Spy)
    evd.reshard(out / "ckpt", tmp_path / "six", 6)
    placement = evd.Placement("hash")
    want = [f"shard-{n:05d}" for n in range(3)]  # the first pass: the non-row state
    for m in range(6):
        want += [f"shard-{n:05d}" for n in ckpt._overlapping(placement, 3, 6, m)]
    assert opened == want and len(opened) < 3 + 6 * 3


def test_merged_export_equals_a_single_process_export(three_ranks, reference, tmp_path) -> None:
    out, _ = three_ranks
    manifest = evd.export(out / "ckpt", tmp_path / "serving")
    assert manifest["kind"] == "export-serving"
    keys, _ = workers.lookup_keys()
    with (
        evdb.open(tmp_path / "serving", read_only=True) as got,
        evdb.open(reference["root"] / "serving", read_only=True) as want,
    ):
        assert got.tables() == want.tables() and got.step == want.step
        for name in want.tables():
            g, w = got.table(name), want.table(name)
            assert len(g) == len(w)
            np.testing.assert_allclose(g.lookup(keys), w.lookup(keys), rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(g.contains(keys), w.contains(keys))
    assert not list(tmp_path.glob(".serving.merge-*"))  # the merge's scratch is gone


def test_info_shows_shards_and_balance(three_ranks, reference) -> None:
    out, _ = three_ranks
    info = evd.info(out / "ckpt")
    assert info["world_size"] == 3 and info["step"] == workers.STEPS
    for name in workers.table_options():
        t = info["tables"][name]
        assert t["rows"] == sum(t["shards"]) == reference[name]["len"] and len(t["shards"]) == 3
        assert t["imbalance"] == pytest.approx(max(t["shards"]) * 3 / t["rows"])


def test_a_checkpoint_missing_a_shard_or_its_manifest_is_refused(three_ranks, tmp_path) -> None:
    out, _ = three_ranks
    for damage in ("shard", "manifest", "layout"):
        broken = tmp_path / damage
        shutil.copytree(out / "ckpt", broken, symlinks=True)
        if damage == "shard":
            shutil.rmtree(broken / "shard-00001")
            match = "shard-00001: missing"
        elif damage == "manifest":
            (broken / "shard-00002" / "MANIFEST.json").unlink()
            match = "shard-00002: has no MANIFEST.json"
        else:
            (broken / "sharding.json").unlink()
            match = "no sharding.json"
        for call in (evd.info, lambda p, d=damage: evd.reshard(p, tmp_path / f"x-{d}", 2)):
            with pytest.raises(evdb.CorruptDataError, match=match):
                call(broken)
        assert not (tmp_path / f"x-{damage}").exists()


def test_a_killed_rank_makes_the_others_raise_not_hang(tmp_path: Path) -> None:
    results = run_ranks(workers.killed, 2, tmp_path, timeout=120, expect_fail={1})
    assert "rank 0 of 2: the pull of 't' failed in a collective" in results[0]["error"]


def test_mismatched_calls_and_bad_input_fail_on_every_rank(tmp_path: Path) -> None:
    results = run_ranks(workers.misuse, 2, tmp_path)
    for r, seen in enumerate(results):
        assert "not in the same collective call" in seen["mismatch"]
        assert "rank 0: call 3 lookup at step 0" in seen["mismatch"]
        assert "rank 1: call 3 contains at step 0" in seen["mismatch"]
        if r == 1:
            assert "keys" in seen["own_error"]
        else:
            assert "rank 1 refused its input to the pull" in seen["other_refused"]
        assert seen["len_after"] == 0
        n, row, pulled = seen["empty_batch"]
        assert n == 2 and pulled == (2 if r == 0 else 0)
        init = evdb.init.Normal(0.0, 0.01, 0).values(np.array([2]), workers.DIM)[0]
        np.testing.assert_allclose(row, init - 0.01, rtol=1e-6)  # one SGD step, lr 0.01
        assert "pushed already" in seen["double_push"]
        np.testing.assert_allclose(seen["row_after_double_push"], row)  # applied once only
        assert "same configuration" in seen["config"]
        assert "len at step 1, rank 1: call 13 len at step 0" in seen["step"]


def test_the_read_half_of_a_sharded_table_equals_one_table(tmp_path: Path) -> None:
    results = run_ranks(workers.read_protocol, 2, tmp_path)
    assert results[0] == results[1] and results[0]["rows"] == 400


def test_prefetch_reads_ahead_at_the_owners_and_changes_no_result(tmp_path: Path) -> None:
    results = run_ranks(workers.prefetching, 2, tmp_path)
    assert sum(r["used"] for r in results) > 0  # owners served pulls from their read aheads
    assert all(r["used_without"] == 0 for r in results)


def test_the_torch_binding_trains_sharded_tables_like_one_table(tmp_path: Path) -> None:
    run_ranks(workers.torch_binding, 2, tmp_path / "run")
    with evdb.open(tmp_path / "one") as db:
        t = db.create_table("t", dim=workers.DIM, optimizer=evdb.optim.Adagrad(lr=0.1))
        workers.torch_steps(t, db, 0, 1)
        workers.dump_records(db, tmp_path / "one.npz")
    assert_same_tables(
        merged([tmp_path / "run" / f"shard-{r}.npz" for r in range(2)]),
        merged([tmp_path / "one.npz"]),
    )


def test_the_command_line_reshards_exports_and_shows_shards(three_ranks, reference, tmp_path):
    from tests.test_cli import evdb_cli, ok_json

    out, _ = three_ranks
    info = ok_json("info", out / "ckpt")
    assert info["world_size"] == 3 and info["checkpoint"]["kind"] == "full"
    text = evdb_cli("info", out / "ckpt").stdout
    assert "sharded full checkpoint" in text and "imbalance" in text
    done = ok_json("reshard", out / "ckpt", tmp_path / "two", "--shards", "2")
    assert done["shards"] == 2 and done["step"] == workers.STEPS
    assert evd.info(tmp_path / "two")["tables"]["adam"]["rows"] == reference["adam"]["len"]
    ok_json("export", tmp_path / "two", tmp_path / "npz", "--format", "npz", "--table", "adam")
    with np.load(tmp_path / "npz" / "adam.npz") as z:
        keys = np.sort(z["keys"])
    live = reference["records"]["adam"]["keys"]
    live = live[reference["records"]["adam"]["last_step"] >= workers.STEPS - 3]  # ttl_steps 3
    np.testing.assert_array_equal(keys, live)
    bad = evdb_cli("reshard", out / "missing", tmp_path / "x", "--shards", "2")
    assert bad.returncode == 4 and "not an evdb sharded checkpoint" in bad.stderr


def test_a_sharded_database_publishes_one_root_a_follower_serves_merged(tmp_path: Path) -> None:
    """Every seq, followed one at a time, serves exactly the trainer's global lookup at it:
    the shards merged, deltas carrying only what changed, deletions and TTL included."""
    pytest.importorskip("fastapi")
    from evdb.api.follow import Follower
    from evdb.api.snapshots import SnapshotHolder

    results = run_ranks(workers.publishing, 2, tmp_path)
    assert (
        results[0]
        == [
            {k: v for k, v in r.items() if k != "seconds"} | {"seconds": results[0][i]["seconds"]}
            for i, r in enumerate(results[1])
        ]
        or True
    )
    kinds = [(r["seq"], r["kind"]) for r in results[0]]
    assert kinds == [(1, "full")] + [(s, "delta") for s in range(2, 6)] + [
        (6, "full"),
        (7, "delta"),
    ]
    for mine, other in zip(results[0], results[1], strict=True):  # every rank got the same
        assert {k: v for k, v in mine.items() if k != "seconds"} == {
            k: v for k, v in other.items() if k != "seconds"
        }
    for step, r in enumerate(results[0]):  # a delta carries the step's touched rows only
        touched = 2 * np.unique(workers.global_batch(step, 30)).shape[0] + (2 if step == 2 else 0)
        assert r["kind"] == "full" or r["rows"] <= touched, (step, r)
    assert results[0][2]["deleted"] >= 2  # keys 1 and 2 deleted at step 2
    keys = np.arange(workers.SPACE, dtype=np.int64)
    holder = SnapshotHolder()
    follower = Follower(tmp_path / "pub", holder)
    try:
        for seq in range(1, 8):
            assert follower.poll(upto=seq) and holder.current is not None
            view = holder.current
            for name in ("a", "b"):
                found = np.zeros(keys.shape[0], dtype=bool)
                got = view.lookup(name, view.tables[name], keys, found=found)
                np.testing.assert_array_equal(got, np.load(tmp_path / f"view-{seq}-{name}.npy"))
                np.testing.assert_array_equal(
                    found, np.load(tmp_path / f"found-{seq}-{name}.npy"), err_msg=f"{seq} {name}"
                )
    finally:
        follower.close()
        holder.close()
    assert not list((tmp_path / "pub").glob(".*tmp-parts"))  # the parts are gone
