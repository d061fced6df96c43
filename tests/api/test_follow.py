"""``evdb serve ROOT --follow``: a server follows the trainer's publications (``api.follow``).

Loopback only; every wait is bounded in count and in time.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import shutil
import subprocess
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

import evdb
from evdb import checkpoint as _checkpoint
from evdb import publish as _publish
from evdb.errors import CorruptDataError

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

from evdb import view_overlay
from evdb.api import Settings, create_app, failures, follow
from evdb.api.follow import Follower, FollowSnapshot
from evdb.api.snapshots import VERSION_HEADER, SnapshotHolder

from . import serve_process


def served(holder: SnapshotHolder, name: str, keys: np.ndarray, **bags):
    """(values, found, seq) of the view a holder serves."""
    snap = holder.acquire()
    assert isinstance(snap, FollowSnapshot)
    try:
        found = np.empty(len(keys), dtype=bool)
        values = snap.tables[name].lookup(keys, found=found, **bags)
        return values, found, snap.seq
    finally:
        holder.release(snap)


def follower(root: Path) -> tuple[Follower, SnapshotHolder]:
    holder = SnapshotHolder()
    return Follower(root, holder), holder


def wait_for(predicate, seconds: float, step: float = 0.05) -> float:
    """Poll predicate until it holds, at most ``seconds`` (then fail); the seconds taken."""
    start = time.monotonic()
    for _ in range(int(seconds / step) + 1):
        if predicate():
            return time.monotonic() - start
        time.sleep(step)
    pytest.fail(f"not within {seconds} s")


def test_an_upsert_is_answered_within_3_seconds(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=4)
        t.upsert(np.arange(100), np.zeros((100, 4), np.float32))
        db.publish(root)
        settings = Settings(follow_root=root, poll_interval_s=0.5)
        with TestClient(create_app(settings)) as client:

            def lookup() -> httpx.Response:
                return client.post("/v1/tables/item/lookup", json={"keys": [7]})

            assert lookup().headers[VERSION_HEADER] == "1"
            start = time.monotonic()
            t.upsert([7], [[1.0, 2.0, 3.0, 4.0]])
            assert db.publish(root)["seq"] == 2

            def fresh() -> bool:
                r = lookup()
                return r.json()["embeddings"] == [[1.0, 2.0, 3.0, 4.0]]

            wait_for(fresh, 3.0 - (time.monotonic() - start))
            assert lookup().headers[VERSION_HEADER] == "2"
            infer = client.post(
                "/v2/models/item/infer",
                json={"inputs": [{"name": "keys", "datatype": "INT64", "shape": [1], "data": [7]}]},
            )
            assert infer.headers[VERSION_HEADER] == "2" and infer.json()["model_version"] == "2"
            metrics = client.get("/metrics").text
            assert "evdb_applied_seq 2.0" in metrics and "evdb_head_seq 2.0" in metrics
            assert "evdb_delta_apply_seconds_count" in metrics
            assert client.get("/readyz").status_code == 200


def _train(db: evdb.Database, root: Path, rng: np.random.Generator, rounds: int) -> list[int]:
    """Training with every kind of change, publishing after each round; returns the seqs."""
    seqs = []
    tables = [db.table(n) for n in db.tables()]
    for r in range(rounds):
        for t in tables:
            keys = rng.integers(0, 400, size=64)
            p = t.pull(keys)
            t.push(p, rng.normal(size=(len(p.keys), t.dim)).astype(np.float32))
            t.upsert(rng.integers(0, 400, size=8), rng.normal(size=(8, t.dim)).astype(np.float32))
            t.delete(rng.integers(0, 400, size=4))
            if r % 3 == 2:
                t.compact()
        db.advance(1)
        seqs.append(db.publish(root, full=r == 5)["seq"])
    return seqs


def _make_tables(db: evdb.Database) -> None:
    init = evdb.init.Normal(std=0.1, seed=5)
    db.create_table("ttl", dim=3, ttl_steps=3, l2_threshold=0.05, dram_rows=64, initializer=init)
    db.create_table("mem", dim=2, dram_rows=200, disk=False, default_value=0.5)
    db.create_table("big", dim=4, dram_rows=32, initializer=init)


def _assert_equal_to_trainer(db: evdb.Database, holder: SnapshotHolder) -> None:
    keys = np.arange(-5, 420, dtype=np.int64)
    for name in db.tables():
        t = db.table(name)
        values, found, _ = served(holder, name, keys)
        np.testing.assert_array_equal(values, t.lookup(keys))  # bit for bit
        np.testing.assert_array_equal(found, t.contains(keys))
        offsets = np.array([0, 3, 3, 100], dtype=np.int64)
        weights = np.linspace(0.5, 2, keys.shape[0]).astype(np.float32)
        bags, _, _ = served(holder, name, keys, offsets=offsets, weights=weights, combiner="sqrtn")
        np.testing.assert_array_equal(bags, t.lookup(keys, offsets, weights, "sqrtn"))


@pytest.mark.parametrize("recent_rows", [65536, 8], ids=["one-layer", "folding"])
def test_followed_and_restarted_servers_equal_the_trainer_bit_for_bit(
    tmp_path: Path, monkeypatch, recent_rows: int
) -> None:
    monkeypatch.setattr(view_overlay, "RECENT_ROWS", recent_rows)  # 8: the recent layer folds often
    root = tmp_path / "pub"
    rng = np.random.default_rng(1)
    with evdb.open(tmp_path / "db") as db:
        _make_tables(db)
        db.publish(root)
        live, live_holder = follower(root)
        assert live.poll()
        for _ in range(3):  # the follower keeps up, a few publications at a time
            seqs = _train(db, root, rng, 4)
            assert live.poll() and live.state.applied_seq == seqs[-1]
            _assert_equal_to_trainer(db, live_holder)
        assert live.state.overlay_rows > 0
        snap = live_holder.current
        assert snap is not None
        folded = any(t.overlay.older.n_rows for t in snap.tables.values())
        assert folded == (recent_rows == 8)
        # a server started now (or restarted: killed, nothing kept) loads the newest full and
        # replays the deltas after it
        fresh, fresh_holder = follower(root)
        assert fresh.poll() and fresh.state.applied_seq == seqs[-1]
        _assert_equal_to_trainer(db, fresh_holder)
        # TTL follows the trainer's step: advancing alone expires rows on both sides
        db.advance(5)
        db.publish(root)
        assert live.poll()
        assert not served(live_holder, "ttl", np.arange(400))[1].any()
        _assert_equal_to_trainer(db, live_holder)
        live.close()
        fresh.close()
        live_holder.close()
        fresh_holder.close()


def test_the_neighbours_row_limit_counts_the_rows_of_the_deltas(tmp_path: Path) -> None:
    """--max-scan-rows counts the rows a neighbours query scans: the publication's, the rows of
    its deltas included (the route counted the full snapshot's rows only, so a table grown past
    the limit by deltas was scanned anyway)."""
    root = tmp_path / "pub"
    rng = np.random.default_rng(8)
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=4)
        t.upsert(np.arange(100), rng.normal(size=(100, 4)).astype(np.float32))
        db.publish(root)
        settings = Settings(follow_root=root, poll_interval_s=3600.0, max_scan_rows=120)
        with TestClient(create_app(settings)) as c:

            def ask() -> httpx.Response:
                return c.post("/v1/tables/item/neighbors", json={"key": 3, "k": 2})

            assert ask().status_code == 200
            t.upsert(np.arange(100, 150), rng.normal(size=(50, 4)).astype(np.float32))
            assert db.publish(root)["kind"] == "delta"
            assert c.app.state.follower.poll()  # applied now, not by the 3600 s timer
            [listed] = c.get("/v1/tables").json()["tables"]
            assert listed["rows"] == 150
            r = ask()
            assert r.status_code == 422 and "has 150 rows" in r.json()["detail"], r.text
            t.delete(np.arange(40))  # back under the limit: 110 rows
            db.publish(root)
            assert c.app.state.follower.poll()
            got = ask().json()
            assert got["keys"] == t.neighbors(3, 2)[0].tolist()


def test_deletes_compaction_and_ttl_reach_the_server(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=2, ttl_steps=2, l2_threshold=0.5, dram_rows=8)
        t.upsert(np.arange(20), np.ones((20, 2), np.float32))
        db.publish(root)
        f, holder = follower(root)
        f.poll()
        assert served(holder, "item", np.arange(20))[1].all()
        t.delete([0, 1])
        db.publish(root)
        f.poll()
        assert served(holder, "item", np.arange(4))[1].tolist() == [False, False, True, True]
        t.upsert([2], [[0.1, 0.1]])  # under the L2 threshold: compaction prunes it
        db.advance(1)
        t.upsert([3], [[1.0, 1.0]])
        assert t.compact()["l2"] == 1
        db.publish(root)
        f.poll()
        assert served(holder, "item", np.arange(4))[1].tolist() == [False, False, False, True]
        db.advance(2)  # the rows of step 0 expire; key 3 (step 1) stays
        db.publish(root)
        f.poll()
        found = served(holder, "item", np.arange(20))[1]
        assert (
            found.tolist()
            == t.contains(np.arange(20)).tolist()
            == [False] * 3 + [True] + [False] * 16
        )
        f.close()
        holder.close()


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fault", ["manifest", "checksum", "gap"])
def test_a_bad_publication_is_refused_while_serving_continues(tmp_path: Path, fault) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=2)
        t.upsert([1], [[1.0, 1.0]])
        db.publish(root)
        f, holder = follower(root)
        assert f.poll()
        t.upsert([1], [[2.0, 2.0]])
        db.publish(root)  # seq 2: damaged below
        t.upsert([1], [[3.0, 3.0]])
        db.publish(root)  # seq 3: good, but after a bad one
        bad = _publish.publication_dir(root, 2)
        if fault == "manifest":  # as if the rename came before the manifest was written
            (bad / "MANIFEST.json").unlink()
        elif fault == "checksum":
            _flip_byte(bad / "item.npz")
        else:
            shutil.rmtree(bad)
        for attempt in (1, 2):  # refused, counted, retried on the next poll
            assert not f.poll()
            assert f.state.failures == {fault: attempt}
            values, found, seq = served(holder, "item", np.array([1]))
            assert seq == 1 and values.tolist() == [[1.0, 1.0]] and found.all()
        assert f.state.head_seq == 3 and f.state.applied_seq == 1
        t.upsert([1], [[4.0, 4.0]])
        assert db.publish(root, full=True)["seq"] == 4  # a new full: the follower moves on
        assert f.poll()
        values, _, seq = served(holder, "item", np.array([1]))
        assert seq == 4 and values.tolist() == [[4.0, 4.0]]
        f.close()
        holder.close()


def test_a_paused_follower_catches_up_on_50_deltas_in_one_swap(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=2)
        t.upsert(np.arange(1000), np.zeros((1000, 2), np.float32))
        db.publish(root)
        f, holder = follower(root)
        assert f.poll() and f.state.swaps == 1
        for i in range(50):
            t.upsert(np.arange(i * 10, i * 10 + 20), np.full((20, 2), i, np.float32))
            assert db.publish(root)["kind"] == "delta"
        assert f.poll()
        assert f.state.swaps <= 1 + 2 and f.state.applied_seq == 51
        values, _, _ = served(holder, "item", np.arange(1000))
        np.testing.assert_array_equal(values, t.lookup(np.arange(1000)))
        f.close()
        holder.close()


def test_readyz_on_staleness_only_when_asked(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    root.mkdir()
    settings = Settings(follow_root=root, poll_interval_s=0.2, max_staleness_s=30.0)
    with TestClient(create_app(settings)) as client:
        assert client.get("/readyz").status_code == 503  # nothing published yet
        with evdb.open(tmp_path / "db") as db:
            db.create_table("item", dim=2)
            db.publish(root)
        wait_for(lambda: client.get("/readyz").status_code == 200, 10)
        follower_ = client.app.state.follower
        follower_.state.published -= 60  # as if the trainer had stopped a minute ago
        r = client.get("/readyz")
        assert r.status_code == 503 and r.json() == {"status": "stale"}
    settings = Settings(follow_root=root, poll_interval_s=0.2)
    with TestClient(create_app(settings)) as client:
        client.app.state.follower.state.published -= 3600
        assert client.get("/readyz").status_code == 200


def test_cli_follow_options(tmp_path: Path) -> None:
    from evdb.tools.cli import cli

    r = CliRunner().invoke(cli, ["serve", str(tmp_path), "--poll-interval", "2"])
    assert r.exit_code == 2 and "need --follow" in r.output
    r = CliRunner().invoke(cli, ["serve", str(tmp_path), "--follow", "--poll-interval", "0"])
    assert r.exit_code == 2 and "poll-interval" in r.output
    evdb.open(tmp_path / "db").close()  # a database, not a publish root: would wait forever
    r = CliRunner().invoke(cli, ["serve", str(tmp_path / "db"), "--follow"])
    assert r.exit_code == 2 and "not a publish root" in r.output and "db.publish" in r.output


# -- a real server, two workers ---------------------------------------------------------------

N_ROWS = 10_000


def start_server(root: Path, workers: int) -> tuple[subprocess.Popen[str], str]:
    """``evdb serve ROOT --follow`` on a free loopback port, once /readyz answers 200."""
    proc, url, _ = serve_process.start(
        str(root), "--follow", "--workers", str(workers), "--poll-interval", "0.2"
    )
    return proc, url


def stop_server(proc: subprocess.Popen[str]) -> None:
    code, out = serve_process.stop(proc)
    assert code == 0, out[-2000:]


@pytest.fixture
def following_server(tmp_path: Path):
    root = tmp_path / "pub"
    db = evdb.open(tmp_path / "db")
    t = db.create_table("item", dim=4, dram_rows=2 * N_ROWS)
    t.upsert(np.arange(N_ROWS), np.zeros((N_ROWS, 4), np.float32))  # epoch 0 at seq 1
    db.publish(root)
    proc, url = start_server(root, workers=2)
    yield url, db, t, root
    db.close()
    stop_server(proc)


def octet_lookup(url: str, table: str, keys: np.ndarray, dim: int) -> tuple[np.ndarray, str]:
    r = httpx.post(
        f"{url}/v1/tables/{table}/lookup",
        content=keys.astype(np.int64).tobytes(),
        headers={"content-type": "application/octet-stream", "accept": "application/octet-stream"},
        timeout=10,
    )
    assert r.status_code == 200
    return np.frombuffer(r.content, np.float32).reshape(-1, dim), r.headers[VERSION_HEADER]


def test_a_killed_and_restarted_server_equals_the_trainer(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    rng = np.random.default_rng(3)
    keys = np.arange(-5, 420, dtype=np.int64)
    with evdb.open(tmp_path / "db") as db:
        _make_tables(db)
        db.publish(root)
        proc, url = start_server(root, workers=1)
        try:
            seqs = _train(db, root, rng, 8)  # a full among them (round 5), deltas after it
            wait_for(lambda: octet_lookup(url, "big", keys, 4)[1] == str(seqs[-1]), 10)
        finally:
            proc.kill()  # SIGKILL: nothing is flushed or handed over
            proc.communicate()
        seqs += _train(db, root, rng, 2)  # published while no server runs
        proc, url = start_server(root, workers=1)
        try:
            for name, dim in (("ttl", 3), ("mem", 2), ("big", 4)):
                values, version = octet_lookup(url, name, keys, dim)
                assert version == str(seqs[-1])
                np.testing.assert_array_equal(values, db.table(name).lookup(keys))
        finally:
            stop_server(proc)


def test_no_answer_mixes_two_deltas_and_versions_never_go_back(following_server) -> None:
    url, db, t, root = following_server
    epochs = {1: 0.0}  # seq -> the value every row holds at that seq
    keys = np.arange(0, N_ROWS, 50, dtype=np.int64)  # 200 keys across the table
    results: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(4)]
    stop = threading.Event()

    def client(i: int) -> None:
        # one keep-alive connection, so one worker: its versions must never go back
        with httpx.Client(base_url=url, timeout=10) as c:
            for _ in range(600):
                if stop.is_set() and len(results[i]) >= 250:
                    break
                r = c.post(
                    "/v1/tables/item/lookup",
                    content=keys.tobytes(),
                    headers={
                        "content-type": "application/octet-stream",
                        "accept": "application/octet-stream",
                    },
                )
                assert r.status_code == 200
                rows = np.frombuffer(r.content, np.float32).reshape(-1, 4)
                results[i].append((int(r.headers[VERSION_HEADER]), rows))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for epoch in range(1, 6):  # five 10,000-row deltas, each a distinct epoch in every row
        t.upsert(np.arange(N_ROWS), np.full((N_ROWS, 4), epoch, np.float32))
        result = db.publish(root)
        assert result["kind"] == "delta" and result["rows"] == N_ROWS
        epochs[result["seq"]] = float(epoch)
        time.sleep(0.3)
    stop.set()
    for th in threads:
        th.join(timeout=120)
    answers = [a for per_client in results for a in per_client]
    assert len(answers) >= 1000
    for per_client in results:
        seqs = [seq for seq, _ in per_client]
        assert seqs == sorted(seqs), "a worker's version went back"
    for seq, rows in answers:
        assert np.unique(rows).tolist() == [epochs[seq]], f"seq {seq} mixes epochs"
    final = max(epochs)
    # connections open at once spread over the workers: each one's worker reaches HEAD
    clients = [httpx.Client(base_url=url, timeout=10) for _ in range(6)]
    try:
        for c in clients:
            wait_for(
                lambda c=c: (
                    c.post("/v1/tables/item/lookup", json={"keys": [0]}).headers[VERSION_HEADER]
                    == str(final)
                ),
                10,
            )
    finally:
        for c in clients:
            c.close()
    seen = {seq for seq, _ in answers}
    print("answers", len(answers), "seqs seen", sorted(seen))
    assert len(seen) >= 3  # the deltas were applied while answering


def test_str_tables_and_an_admin_reload_while_following(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        tok = db.create_table("tok", dim=2, key_type="str", keep_strings=True)
        tok.upsert(["a", "b"], [[1.0, 1.0], [2.0, 2.0]])
        db.publish(root)
        evdb.export(db, tmp_path / "export")
        settings = Settings(
            follow_root=root, poll_interval_s=0.2, token="t", allow_roots=(tmp_path,)
        )
        with TestClient(create_app(settings)) as client:
            tok.upsert(["b", "c"], [[5.0, 5.0], [6.0, 6.0]])
            tok.delete(["a"])
            db.publish(root)
            client.app.state.follower.poll()

            def lookup() -> httpx.Response:
                return client.post("/v1/tables/tok/lookup", json={"keys": ["a", "b", "c"]})

            r = lookup()
            assert r.headers[VERSION_HEADER] == "2"
            want = tok.lookup(["a", "b", "c"])
            np.testing.assert_array_equal(np.array(r.json()["embeddings"], np.float32), want)
            assert r.json()["found"] == [False, True, True]
            reload = client.post(
                "/v1/admin/reload",
                json={"path": str(tmp_path / "export")},
                headers={"authorization": "Bearer t"},
            )
            assert reload.status_code == 200
            assert lookup().headers[VERSION_HEADER] != "2"  # the explicit way back
            assert "evdb_admin_reloads_while_following 1.0" in client.get("/metrics").text
            tok.upsert(["d"], [[7.0, 7.0]])
            db.publish(root)
            client.app.state.follower.poll()
            assert lookup().headers[VERSION_HEADER] == "3"


def test_a_follower_left_behind_by_retention_loads_the_newest_full(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=2)
        t.upsert([1], [[1.0, 1.0]])
        db.publish(root, keep=1)
        f, holder = follower(root)
        assert f.poll()
        for i, full in enumerate([False, True, False, True, False]):
            t.upsert([1], [[float(i), 0.0]])
            db.publish(root, full=full, keep=1)
        assert _publish.list_publications(root) == [5, 6]  # seq 1, the follower's, is gone
        assert f.poll() and f.state.applied_seq == 6
        values, _, seq = served(holder, "item", np.array([1]))
        assert seq == 6 and values.tolist() == [[4.0, 0.0]]
        f.close()
        holder.close()


def test_cli_serve_hands_its_options_to_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `evdb serve` passes to uvicorn's workers: the EVDB_* environment they read
    their Settings from (--cache-rows, --mmap-reads), for the app factory."""
    import os

    import uvicorn

    from evdb.api.settings import get_settings
    from evdb.tools.cli import cli

    with evdb.open(tmp_path / "db") as db:
        db.create_table("t", dim=2).upsert([1], [[1.0, 2.0]])
    monkeypatch.setattr(os, "environ", dict(os.environ))  # what serve sets is undone after
    seen: dict[str, object] = {}

    def run(app: str, **kwargs: object) -> None:
        seen.update(kwargs, app=app)
        get_settings.cache_clear()
        try:
            seen["settings"] = get_settings()
        finally:
            get_settings.cache_clear()

    monkeypatch.setattr(uvicorn, "run", run)
    args = ["serve", str(tmp_path / "db"), "--cache-rows", "16", "--mmap-reads"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    settings = seen["settings"]
    assert isinstance(settings, Settings)
    assert settings.cache_rows == 16 and settings.mmap_reads is True
    assert settings.path == (tmp_path / "db").resolve() and seen["app"] == "evdb.api:create_app"
    os.environ.pop("EVDB_MMAP_READS")
    r = CliRunner().invoke(cli, ["serve", str(tmp_path / "db")])
    assert r.exit_code == 0, r.output
    assert seen["settings"].mmap_reads is False  # type: ignore[attr-defined]


# -- failures a follower expects: logged once as one line, counted, the last view served ----


def _claim_huge_values(pub: Path, table: str = "item") -> None:
    """Rewrite a delta's ``values`` to declare 2**59 rows (its data unchanged) and its
    manifest to match: a delta that checks out but that no server can allocate."""
    npz = pub / f"{table}.npz"
    with np.load(npz) as z:
        arrays = {k: z[k] for k in z.files}
    with zipfile.ZipFile(npz, "w") as out:
        for name, a in arrays.items():
            buf = io.BytesIO()
            np.save(buf, a)
            raw = buf.getvalue()
            if name == "values":
                declared = f"'shape': {a.shape}".encode()
                raw = raw.replace(declared, f"'shape': ({2**59}, {a.shape[1]})".encode())
            out.writestr(f"{name}.npy", raw)
    manifest = json.loads((pub / _checkpoint.MANIFEST).read_text())
    entry = {"size": npz.stat().st_size, "xxh3_128": _checkpoint.file_digest(npz)}
    manifest["files"][npz.name] = entry
    (pub / _checkpoint.MANIFEST).write_text(json.dumps(manifest))


def _follow_logs(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "evdb.api.follow"]


def _published_twice(tmp_path: Path) -> tuple[evdb.Database, Path]:
    """A database with ``item`` published as seq 1 ([1] = [1, 1]) and seq 2 ([1] = [2, 2])."""
    root = tmp_path / "pub"
    db = evdb.open(tmp_path / "db")
    t = db.create_table("item", dim=2)
    t.upsert([1], [[1.0, 1.0]])
    db.publish(root)
    t.upsert([1], [[2.0, 2.0]])
    db.publish(root)
    return db, root


def test_a_delta_too_big_to_allocate_is_one_log_line_counted_while_seq_1_is_served(
    tmp_path: Path, caplog
) -> None:
    """A delta the server cannot allocate raised MemoryError out of poll: a traceback at
    every poll (once a second), and a failed start when it was met at the first poll."""
    db, root = _published_twice(tmp_path)
    f, holder = follower(root)
    assert f.poll(upto=1)
    bad = _publish.publication_dir(root, 2)
    _claim_huge_values(bad)
    caplog.set_level(logging.DEBUG, logger="evdb.api.follow")
    for attempt in (1, 2, 3):
        assert not f.poll()
        assert f.state.failures == {"memory": attempt}
        values, _, seq = served(holder, "item", np.array([1]))
        assert seq == 1 and values.tolist() == [[1.0, 1.0]]
    [record] = _follow_logs(caplog)  # once, not per poll
    assert record.levelno == logging.WARNING and not record.exc_info  # no traceback
    line = record.getMessage()
    assert "\n" not in line and "(memory)" in line and "serving seq 1" in line
    assert str(bad) in line and "Unable to allocate" in line
    f.close()
    holder.close()
    db.close()


def test_a_repeated_failure_is_logged_again_after_repeat_log_s_with_its_count(
    tmp_path: Path, caplog, monkeypatch
) -> None:
    db, root = _published_twice(tmp_path)
    f, holder = follower(root)
    assert f.poll(upto=1)
    _flip_byte(_publish.publication_dir(root, 2) / "item.npz")
    caplog.set_level(logging.WARNING, logger="evdb.api.follow")
    assert not f.poll() and not f.poll()
    assert len(_follow_logs(caplog)) == 1
    monkeypatch.setattr(failures, "REPEAT_LOG_S", 0.0)  # the low rate's interval has passed
    assert not f.poll()
    first, again = (r.getMessage() for r in _follow_logs(caplog))
    assert "(checksum)" in first and "item.npz" in first
    assert again.startswith(first) and again.endswith("s)") and "(2 more times in" in again
    assert f.state.failures == {"checksum": 3}
    f.close()
    holder.close()
    db.close()


def _unreadable(monkeypatch, path: Path) -> None:
    """Checking a publication meets ``path`` unreadable, as a non-root process meets a
    ``chmod 000`` file (tests run as root, which reads it anyway)."""
    verify = _checkpoint.verify

    def refusing(root: Any) -> dict[str, Any]:
        if Path(root) == path.parent:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return verify(root)

    monkeypatch.setattr(_checkpoint, "verify", refusing)


def test_an_unreadable_file_is_unreadable_not_a_checksum_mismatch(
    tmp_path: Path, caplog, monkeypatch
) -> None:
    db, root = _published_twice(tmp_path)
    f, holder = follower(root)
    assert f.poll(upto=1)
    npz = _publish.publication_dir(root, 2) / "item.npz"
    with monkeypatch.context() as m:
        _unreadable(m, npz)
        caplog.set_level(logging.WARNING, logger="evdb.api.follow")
        assert not f.poll() and not f.poll()
        assert f.state.failures == {"unreadable": 2}
        [record] = _follow_logs(caplog)
        assert f"(unreadable): {npz}: permission denied; serving seq 1" in record.getMessage()
        assert served(holder, "item", np.array([1]))[2] == 1
    assert f.poll()  # readable again: applied on the next poll
    values, _, seq = served(holder, "item", np.array([1]))
    assert seq == 2 and values.tolist() == [[2.0, 2.0]]
    f.close()
    holder.close()
    db.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 file")
def test_a_chmod_000_file_is_unreadable(tmp_path: Path) -> None:
    db, root = _published_twice(tmp_path)
    f, holder = follower(root)
    assert f.poll(upto=1)
    npz = _publish.publication_dir(root, 2) / "item.npz"
    npz.chmod(0)
    try:
        assert not f.poll()
    finally:
        npz.chmod(0o644)
    assert f.state.failures == {"unreadable": 1}
    f.close()
    holder.close()
    db.close()


@pytest.mark.parametrize(
    ("error", "reason", "detail"),
    [
        (PermissionError(errno.EACCES, "Permission denied", "/p/2/a.npz"), "unreadable",
         "/p/2/a.npz: permission denied"),
        (CorruptDataError("/p/2/MANIFEST.json: cannot read the manifest"),
         "manifest", "/p/2/MANIFEST.json: cannot read the manifest"),
        (MemoryError("Unable to allocate 4.00 EiB"), "memory",
         "/p/2: not enough memory to apply it (Unable to allocate 4.00 EiB)"),
        (OSError(errno.EIO, "Input/output error", "/p/2/a.npz"), "read",
         "/p/2/a.npz: Input/output error"),
        (ValueError("cannot reshape array"), "manifest", "/p/2: cannot reshape array"),
    ],
)  # fmt: skip
def test_a_failure_is_classified_by_its_cause_and_names_the_file(error, reason, detail) -> None:
    assert follow.cause(error, "manifest", Path("/p/2")) == (reason, detail)


def test_a_permission_error_under_an_evdb_error_is_unreadable() -> None:
    """evdb reads a manifest or HEAD it cannot open as CorruptDataError, from the OSError."""
    try:
        try:
            raise PermissionError(errno.EACCES, "Permission denied", "/p/HEAD")
        except OSError as e:
            raise CorruptDataError("/p/HEAD: cannot read the publish HEAD") from e
    except CorruptDataError as e:
        assert follow.cause(e, "head") == ("unreadable", "/p/HEAD: permission denied")


def test_a_served_follower_counts_failures_in_its_metrics_and_keeps_serving(
    tmp_path: Path, caplog
) -> None:
    db, root = _published_twice(tmp_path)
    _claim_huge_values(_publish.publication_dir(root, 2))
    caplog.set_level(logging.WARNING, logger="evdb.api.follow")
    settings = Settings(follow_root=root, poll_interval_s=3600.0)  # polled by hand below
    with TestClient(create_app(settings)) as client:  # its first poll met seq 2
        follower_ = client.app.state.follower
        assert not follower_.poll()
        r = client.post("/v1/tables/item/lookup", json={"keys": [1]})
        assert r.headers[VERSION_HEADER] == "1" and r.json()["embeddings"] == [[1.0, 1.0]]
        metrics = client.get("/metrics").text
        assert 'evdb_delta_failures_total{reason="memory"} 2.0' in metrics
        assert "evdb_applied_seq 1.0" in metrics
    assert len(_follow_logs(caplog)) == 1
    db.close()


def test_a_bug_in_polling_logs_its_traceback_once_not_at_every_poll(
    tmp_path: Path, caplog, monkeypatch
) -> None:
    db, root = _published_twice(tmp_path)
    db.close()
    settings = Settings(follow_root=root, poll_interval_s=0.01)
    caplog.set_level(logging.WARNING, logger="evdb.api.follow")
    with TestClient(create_app(settings)) as client:
        state = client.app.state.follower.state

        def broken(upto: int | None = None) -> bool:
            raise RuntimeError("a bug")

        monkeypatch.setattr(client.app.state.follower, "poll", broken)
        wait_for(lambda: state.failures["error"] >= 5, 10.0)
    [record] = [r for r in _follow_logs(caplog) if "polling" in r.getMessage()]
    assert record.exc_info is not None and "a bug" in str(record.exc_info[1])
