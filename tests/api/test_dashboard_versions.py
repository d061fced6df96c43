"""Every figure on a dashboard page is of one version of the data (issue 30): following a
publish root, the strip's seq, the overview's rows and the distributions' sample, row count
and fitted slope are the followed publication's; on a serving export, what does not apply to
a snapshot (pull counts it has not got, ages it does not keep, the writer's evictions) is not
shown. Through the JSON the page draws from (tests/api/test_dashboard_browser.py drives the
page)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evdb

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

from evdb.api import Settings, create_app
from evdb.api.dashboard import NO_COUNTS, rank_frequency

from .test_routes import PRESENT


def trainer_figures(t: evdb.Table) -> dict[str, Any]:
    """What the trainer's table holds now: rows, and the slope of its pull counts."""
    freq = np.concatenate([r.freq for _, r in t.records(live_only=True)])
    return {"rows": len(t), "slope": rank_frequency(freq)["slope"]}


def wait_for_seq(c: TestClient, seq: int) -> None:
    deadline = time.monotonic() + 30
    while c.get("/v1/dashboard/summary").json()["server"].get("seq") != seq:
        assert time.monotonic() < deadline, f"the follower did not apply seq {seq}"
        time.sleep(0.1)


def page(c: TestClient, table: str) -> dict[str, Any]:
    """The figures a page shows for ``table``: the strip, its overview card, its
    distributions and its projection."""
    summary = c.get("/v1/dashboard/summary").json()
    card = next(t for t in summary["tables"] if t["name"] == table)
    dist = c.get(f"/v1/dashboard/tables/{table}/distributions").json()
    proj = c.get(f"/v1/dashboard/tables/{table}/projection").json()
    return {"server": summary["server"], "card": card, "dist": dist, "proj": proj}


def test_following_every_figure_is_the_followed_versions(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    rng = np.random.default_rng(8)
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=4)
        ranks = np.arange(1, 2001)
        pulls = np.repeat(ranks, np.maximum(1, (4000 * ranks**-1.1).astype(np.int64)))
        rng.shuffle(pulls)
        for batch in np.array_split(pulls, 4):
            t.pull(batch)
        db.publish(root, full=True)
        at_full = trainer_figures(t)
        with TestClient(create_app(Settings(follow_root=root, poll_interval_s=0.1))) as c:
            wait_for_seq(c, 1)
            p = page(c, "item")
            version = p["server"]["version"]
            assert p["server"]["seq"] == p["dist"]["seq"] == p["proj"]["seq"] == 1
            assert p["dist"]["version"] == p["proj"]["version"] == version
            assert p["card"]["rows"] == p["dist"]["rows"] == at_full["rows"] == 2000
            assert p["dist"]["sample_rows"] == 2000  # every row: the sample is the table
            assert p["dist"]["counted"] and p["dist"]["frequency_note"] is None
            assert p["dist"]["frequency"]["slope"] == pytest.approx(at_full["slope"], abs=1e-12)

            # a delta: rows added and removed, the hottest rows trained on (their counts rise
            # in the trainer, and the delta carries their new values but no counts)
            t.upsert(np.arange(5000, 5300), rng.normal(size=(300, 4)).astype(np.float32))
            t.delete(np.arange(1500, 1600))
            t.upsert(np.arange(1, 21), rng.normal(size=(20, 4)).astype(np.float32))
            assert db.publish(root)["kind"] == "delta"
            wait_for_seq(c, 2)
            p = page(c, "item")
            assert p["server"]["seq"] == p["dist"]["seq"] == p["proj"]["seq"] == 2
            assert p["dist"]["version"] == p["proj"]["version"] == p["server"]["version"]
            assert p["card"]["rows"] == p["dist"]["rows"] == len(t) == 2200
            # the tiers hold the full (seq 1), the overlay the delta's 320 rows and 100 removals
            assert p["server"]["full_seq"] == 1
            tiers = {x["name"]: x for x in p["card"]["tiers"]}
            assert tiers["overlay"]["rows"] == 420 and tiers["overlay"]["bytes"] > 0
            assert p["dist"]["sample_rows"] == 2200 == len(p["proj"]["x"])
            # this version's counts are not known: no slope of another version's rows
            assert not p["dist"]["counted"] and p["dist"]["frequency"]["slope"] is None
            assert p["dist"]["frequency"]["rank"] == []
            assert "deltas carry no pull counts" in p["dist"]["frequency_note"]
            assert "320 of the 2,200 sampled rows changed" in p["dist"]["frequency_note"]

            # the next full publication has them again, equal to the trainer's
            db.publish(root, full=True)
            wait_for_seq(c, 3)
            p = page(c, "item")
            assert p["dist"]["seq"] == p["server"]["seq"] == p["server"]["full_seq"] == 3
            assert p["dist"]["counted"]
            assert [x["rows"] for x in p["card"]["tiers"] if x["name"] == "overlay"] == [0]
            want = trainer_figures(t)
            assert p["card"]["rows"] == p["dist"]["rows"] == want["rows"]
            assert p["dist"]["frequency"]["slope"] == pytest.approx(want["slope"], abs=1e-12)


def test_a_serving_export_shows_only_what_applies_to_it(settings: Settings, snapshots) -> None:
    """No pull counts, no ages (every row stamped with the export's step), and the cache's
    evictions and promotions counted from this server's start, not the writer's."""
    small = Settings(path=snapshots[0], cache_rows=16, sample_interval_s=60)
    with evdb.open(snapshots[0], read_only=True, cache_rows=16) as db:
        left = db.table("item").stats()["tiers"]["dram"]  # what the export left in its stats
    with TestClient(create_app(small)) as c:
        d = c.get("/v1/dashboard/tables/item/distributions").json()
        assert not d["counted"] and d["frequency_note"] == NO_COUNTS
        assert d["frequency"] == {"rank": [], "freq": [], "slope": None, "fit": [0, 0]}
        assert not d["age"]["shown"] and "no ages to show" in d["age"]["note"]
        series = c.get("/v1/dashboard/series").json()["tables"]["item"]
        assert series["evictions"][-1] == series["promotions"][-1] == 0
        assert "not_admitted" not in series and "written_back" not in series
        keys = [k * 7 - 1000 for k in range(300)]
        for i in range(0, 300, 50):  # more rows than the cache holds: it evicts
            assert (
                c.post("/v1/tables/item/lookup", json={"keys": keys[i : i + 50]}).status_code == 200
            )
        stats = c.app.state.holder.current.tables["item"].stats()["tiers"]["dram"]
        series = c.get("/v1/dashboard/series").json()["tables"]["item"]
        assert series["evictions"][-1] == stats["evictions"] - left["evictions"] > 0
        assert series["promotions"][-1] == stats["promotions"] - left["promotions"] > 0
        assert c.post("/v1/tables/item/lookup", json={"keys": PRESENT}).status_code == 200


def test_a_table_with_ages_still_shows_them(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("aged", dim=2)
        t.upsert(np.arange(10), np.ones((10, 2), np.float32))
        db.advance(5)
        t.upsert(np.arange(10, 20), np.ones((10, 2), np.float32))
    with TestClient(create_app(Settings(path=tmp_path / "db", sample_interval_s=60))) as c:
        age = c.get("/v1/dashboard/tables/aged/distributions").json()["age"]
        assert age["shown"] and age["note"] is None and sum(age["counts"]) == 20
