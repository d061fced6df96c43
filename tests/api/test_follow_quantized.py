"""A follower serving quantised (``evdb serve ROOT --follow --dtype int8``): each full
publication quantised as it loads, each delta's rows as applied, so that at every seq it
answers exactly what an int8 (int4) export of the trainer's database at that step answers,
within half a quantisation step of the float32 follower, TTL verdicts included; and what it
holds is the quantised rows, never a float32 table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import evdb

pytest.importorskip("fastapi")

from click.testing import CliRunner
from fastapi.testclient import TestClient

from evdb.api import Settings, create_app
from evdb.api.follow import Follower, FollowSnapshot
from evdb.api.snapshots import SnapshotHolder
from evdb.quantized import QuantizedSnapshot, QuantizedTable, open_quantized
from evdb.view import TableView
from evdb.view_overlay import code_words

DIMS = {"item": 8, "ttl": 5}  # 5: int4 codes and padding of an odd row
PROBE = np.concatenate([np.arange(-5, 130), [2**62, -(2**63)]]).astype(np.int64)


def _trainer_steps(db: evdb.Database, root: Path, exports: Path, dtype: str) -> list[int]:
    """Publish a full then three deltas (updates, new keys, deletes, TTL expiry), exporting
    the database as dtype after each publication; returns the seqs."""
    rng = np.random.default_rng(5)
    item = db.create_table("item", dim=8, initializer=evdb.init.Normal(std=0.3, seed=1))
    ttl = db.create_table("ttl", dim=5, ttl_steps=2, default_value=0.0)
    item.upsert(np.arange(100), rng.normal(size=(100, 8)).astype(np.float32) * 2)
    ttl.upsert(np.arange(50), rng.normal(size=(50, 5)).astype(np.float32))
    seqs = []
    for i in range(4):
        if i:
            db.advance(1)
            changed = rng.choice(120, 30, replace=False)
            item.upsert(changed, rng.normal(size=(30, 8)).astype(np.float32) * (i + 1))
            item.delete(rng.choice(100, 5, replace=False))
            ttl.upsert(np.arange(10 * i, 10 * i + 10), rng.normal(size=(10, 5)).astype(np.float32))
        seqs.append(int(db.publish(root, full=i == 0)["seq"]))
        evdb.export(db, exports / f"{dtype}-{seqs[-1]}", dtype=dtype)
    return seqs


@pytest.fixture(scope="module", params=["int8", "int4"])
def published(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    dtype = request.param
    tmp = tmp_path_factory.mktemp(f"follow-{dtype}")
    with evdb.open(tmp / "db") as db:
        seqs = _trainer_steps(db, tmp / "pub", tmp, dtype)
    return tmp, dtype, seqs


def _read(holder: SnapshotHolder, name: str, keys: np.ndarray, **bags):
    snap = holder.acquire()
    assert isinstance(snap, FollowSnapshot)
    try:
        found = np.empty(len(keys), bool)
        return snap.tables[name].lookup(keys, found=found, **bags), found, snap
    finally:
        holder.release(snap)


def test_each_seq_answers_the_quantised_export_of_that_step(published) -> None:
    tmp, dtype, seqs = published
    quantised = Follower(tmp / "pub", SnapshotHolder(), dtype=dtype, cache_dir=tmp)
    qholder = quantised.holder
    plain = Follower(tmp / "pub", SnapshotHolder())
    bounds = np.array([0, 3, 3, 40, len(PROBE)], np.int64)
    weights = np.linspace(-1, 2, len(PROBE)).astype(np.float32)
    try:
        for seq in seqs:
            assert quantised.poll(upto=seq) and plain.poll(upto=seq)
            with open_quantized(tmp / f"{dtype}-{seq}") as export:
                for name in DIMS:
                    want = export.table(name)
                    got, found, snap = _read(qholder, name, PROBE)
                    assert snap.seq == seq
                    np.testing.assert_array_equal(got, want.lookup(PROBE))  # the same kernel
                    assert found.tolist() == want.contains(PROBE).tolist()
                    view = snap.tables[name]
                    assert view.count() == len(want) and view.contains(PROBE).tolist() == (
                        found.tolist()
                    )
                    bags = {"offsets": bounds[:-1], "weights": weights, "combiner": "sum"}
                    # bags: the same rows summed in another order (view: gather, then
                    # combine; export: fused), float32's epsilon times the terms' size
                    want_bags = want.lookup(PROBE, **bags)
                    terms = float(np.abs(want_bags).max()) + 1.0
                    np.testing.assert_allclose(
                        _read(qholder, name, PROBE, **bags)[0],
                        want_bags,
                        rtol=2e-5,
                        atol=2e-6 * terms * len(PROBE),
                    )
                    # within half a step of the float32 follower (the trainer's rows)
                    exact, exact_found, _ = _read(plain.holder, name, PROBE)
                    assert exact_found.tolist() == found.tolist()
                    rows = exact[found].astype(np.float64)
                    levels = 255 if dtype == "int8" else 15
                    step = (rows.max(axis=1) - rows.min(axis=1)) / levels
                    err = np.abs(got[found] - rows).max(axis=1)
                    assert (err <= step / 2 * (1 + 2**-9) + 1e-6).all()
                    np.testing.assert_array_equal(got[~found], exact[~found])  # defaults
        # TTL 2 at step 3: the full's rows last written at step 0 are gone, as the trainer's
        ttl_found = _read(qholder, "ttl", np.arange(50))[1]
        assert ttl_found.tolist() == [10 <= k < 40 for k in range(50)]
    finally:
        quantised.close()
        plain.close()


def test_the_follower_holds_no_float32_table(published) -> None:
    tmp, dtype, _ = published
    follower = Follower(tmp / "pub", SnapshotHolder(), dtype=dtype, cache_dir=tmp)
    try:
        assert follower.poll()
        snap = follower.holder.current
        assert isinstance(snap, FollowSnapshot)
        base = follower._base
        assert base is not None and isinstance(base.db, QuantizedSnapshot)  # the full: closed
        assert base.files is not None and base.files.parent.parent == tmp
        for name, dim in DIMS.items():
            view = snap.tables[name]
            assert isinstance(view, TableView) and isinstance(view.table, QuantizedTable)
            assert view.table.dtype == dtype
            overlay = view.overlay
            assert overlay.n_rows > 0 and overlay.bits == (8 if dtype == "int8" else 4)
            for rows in overlay.layers:  # codes, in words: fewer columns than the row's dim
                assert rows.values.shape[1] == code_words(dim, overlay.bits) < dim
            assert view.stats()["dtype"] == dtype
        files = base.files
    finally:
        follower.close()
        follower.holder.close()
    assert not files.exists()  # the quantised fulls go with the follower


def test_settings_serve_quantised(published) -> None:
    tmp, dtype, seqs = published
    settings = Settings(follow_root=tmp / "pub", follow_dtype=dtype, follow_cache=tmp)
    with (
        TestClient(create_app(settings)) as client,
        open_quantized(tmp / f"{dtype}-{seqs[-1]}") as q,
    ):
        r = client.post("/v1/tables/item/lookup", json={"keys": PROBE.tolist()})
        assert r.status_code == 200, r.text
        assert r.headers["x-evdb-version"] == str(seqs[-1])
        got = np.array(r.json()["embeddings"], np.float32)
        np.testing.assert_array_equal(got, q.table("item").lookup(PROBE))
        r = client.post("/v1/tables/item/lookup", json={"keys": PROBE.tolist(), "dtype": "float16"})
        half = np.array(r.json()["embeddings"], np.float64).astype(np.float16)
        np.testing.assert_array_equal(half, q.table("item").lookup(PROBE).astype(np.float16))
        assert client.get("/v1/tables/item").json()["dtype"] == dtype
        for view in ("distributions", "projection"):
            assert client.get(f"/v1/dashboard/tables/item/{view}").status_code == 200


def test_the_environment_says_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evdb.api.settings import get_settings

    monkeypatch.setenv("EVDB_FOLLOW_ROOT", str(tmp_path))
    monkeypatch.setenv("EVDB_FOLLOW_DTYPE", "int4")
    monkeypatch.setenv("EVDB_FOLLOW_CACHE", str(tmp_path / "cache"))
    get_settings.cache_clear()
    try:
        settings = get_settings()
        assert (settings.follow_dtype, settings.follow_cache) == ("int4", tmp_path / "cache")
    finally:
        get_settings.cache_clear()


def test_a_bad_dtype_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="follow_dtype must be one of float32, int8, int4"):
        Settings(follow_root=tmp_path, follow_dtype="int16")
    with pytest.raises(evdb.InvalidArgumentError, match="dtype must be one of"):
        Follower(tmp_path, SnapshotHolder(), dtype="float16")
    from evdb.tools.cli import cli

    r = CliRunner().invoke(cli, ["serve", str(tmp_path), "--dtype", "int8"])
    assert r.exit_code == 2 and "--dtype needs --follow" in r.output
    r = CliRunner().invoke(cli, ["serve", str(tmp_path), "--follow", "--dtype", "int16"])
    assert r.exit_code == 2 and "int8" in r.output


def test_the_merge_copies_code_words_bit_for_bit() -> None:
    # quantised codes ride the float32 merge as words: signalling-NaN and denormal patterns
    # among them must come out as they went in
    from evdb.view_overlay import Rows

    patterns = np.array([[0x7FA00001, 0xFFBFFFFF], [0x00000001, 0x7F800001]], np.uint32)
    older = Rows(
        np.array([1, 3]), patterns.view(np.float32), np.zeros(2, np.int64), np.zeros(2, bool)
    )
    newer = Rows(
        np.array([2, 3]), patterns[::-1].copy().view(np.float32), np.ones(2, np.int64),
        np.zeros(2, bool),
    )  # fmt: skip
    merged = older.under(newer)
    assert merged.keys.tolist() == [1, 2, 3]
    got = merged.values.view(np.uint32)
    assert got.tolist() == [patterns[0].tolist(), patterns[1].tolist(), patterns[0].tolist()]
