"""The dashboard's JSON, the neighbours route and the offline docs, through the app (no
browser: tests/api/test_dashboard_browser.py drives the page itself)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import evdb

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

from evdb.api import Settings, create_app
from evdb.api.dashboard import PAGE_FILES, STATIC, rank_frequency
from evdb.api.routers.neighbors import MAX_K
from evdb.api.sampler import quantile

from .dashboard_data import AGES_TTL, ZIPF_SLOPE, build_database, serving, words

JS_BUDGET = 150_000  # bytes of JavaScript the dashboard page loads, at most


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_database(tmp_path_factory.mktemp("dashboard-json") / "db")


@pytest.fixture(scope="module")
def reference(database: Path) -> Iterator[evdb.Database]:
    with evdb.open(database, read_only=True) as db:
        yield db


def client_for(database: Path, **options: Any) -> TestClient:
    return TestClient(create_app(Settings(path=database, **options)))


@pytest.fixture(scope="module")
def client(database: Path) -> Iterator[TestClient]:
    with client_for(database, sample_interval_s=60) as c:
        yield c


def test_summary_is_stats(client: TestClient, reference: evdb.Database) -> None:
    body = client.get("/v1/dashboard/summary").json()
    assert body["server"]["step"] == reference.step and body["server"]["workers"] == 1
    by_name = {t["name"]: t for t in body["tables"]}
    assert sorted(by_name) == sorted(reference.tables())
    for name in reference.tables():
        want = reference.table(name).stats()
        got = by_name[name]
        assert (got["rows"], got["dim"]) == (want["rows"], want["dim"])
        for key in ("name", "dim", "rows", "step", "version", "admission"):
            assert got["stats"][key] == want[key]
        assert [t["name"] for t in got["tiers"]] == list(want["tiers"])


def test_the_series_counts_lookups(client: TestClient) -> None:
    def last() -> float:
        series = client.get("/v1/dashboard/series").json()
        return float(series["tables"]["zipf"]["lookups"][-1])

    before = last()
    for i in range(5):
        assert client.post("/v1/tables/zipf/lookup", json={"keys": [i, 16]}).status_code == 200
    assert last() == before + 5
    client.get("/v1/dashboard/summary")  # not a lookup: not counted
    assert last() == before + 5


def test_distributions_show_the_zipf_slope_and_two_ages(client: TestClient) -> None:
    z = client.get("/v1/dashboard/tables/zipf/distributions").json()
    assert abs(z["frequency"]["slope"] - ZIPF_SLOPE) <= 0.15
    assert z["sample_rows"] == z["rows"] == 3000 and z["counted"]
    ages = client.get("/v1/dashboard/tables/ages/distributions").json()["age"]
    assert ages["ttl_steps"] == AGES_TTL and ages["edges"][-1] == AGES_TTL
    assert ages["counts"][0] == ages["counts"][-1] == 500 and sum(ages["counts"]) == 1000


def test_rank_frequency_fits_the_power_law_and_tolerates_no_counts() -> None:
    ranks = np.arange(1, 5001)
    freq = np.round(1e6 * ranks**-0.8)
    assert rank_frequency(freq)["slope"] == pytest.approx(-0.8, abs=0.02)
    assert rank_frequency(np.zeros(10))["slope"] is None
    assert rank_frequency(np.ones(10))["slope"] is None  # flat: no slope to fit


def test_the_projection_is_labelled_by_string(client: TestClient) -> None:
    p = client.get("/v1/dashboard/tables/words/projection").json()
    tokens = words()[0]
    assert len(p["x"]) == len(p["y"]) == len(p["labels"]) == len(tokens)
    assert sorted(p["labels"]) == sorted(tokens)
    assert 0 < p["explained"][1] <= p["explained"][0] < 1


def test_a_missing_table_is_404(client: TestClient) -> None:
    r = client.get("/v1/dashboard/tables/nope/distributions")
    assert r.status_code == 404 and "nope" in r.json()["detail"]


def test_neighbors_route_equals_table_neighbors(
    client: TestClient, reference: evdb.Database
) -> None:
    z = reference.table("zipf")
    for body, query in (({"key": 16}, 16), ({"vector": [0.5] * 8, "metric": "l2"}, [0.5] * 8)):
        r = client.post("/v1/tables/zipf/neighbors", json={**body, "k": 7})
        assert r.status_code == 200, r.text
        keys, scores = z.neighbors(query, 7, body.get("metric", "cosine"))
        assert r.json()["keys"] == keys.tolist()
        np.testing.assert_allclose(r.json()["scores"], scores, rtol=1e-6)
    word = words()[0][3]
    r = client.post("/v1/tables/words/neighbors", json={"key": word, "k": 3}).json()
    keys, _ = reference.table("words").neighbors(word, 3)
    assert r["keys"] == keys.tolist()
    assert r["strings"] == reference.table("words").strings(keys)


@pytest.mark.parametrize(
    ("body", "status", "match"),
    [
        ({"key": 1, "k": MAX_K + 1}, 422, f"k: at most {MAX_K}"),
        ({"key": 1, "vector": [1.0] * 8}, 422, "exactly one of key and vector"),
        ({"k": 3}, 422, "exactly one of key and vector"),
        ({"vector": [1.0, 2.0]}, 422, r"query: a vector must have shape \(8,\)"),
        ({"key": 1, "metric": "manhattan"}, 422, "metric"),
        ({"key": "word"}, 422, "this table takes integer keys"),
        ({"key": 1, "k": 0}, 422, "k"),
    ],
)
def test_neighbors_route_refusals(client: TestClient, body: dict, status: int, match: str) -> None:
    r = client.post("/v1/tables/zipf/neighbors", json=body)
    assert r.status_code == status and re.search(match, r.json()["detail"]), r.text


def test_neighbors_refuses_tables_above_max_scan_rows(database: Path) -> None:
    with client_for(database, max_scan_rows=2999) as c:
        r = c.post("/v1/tables/zipf/neighbors", json={"key": 16})
        assert r.status_code == 422
        assert "3,000 rows, more than --max-scan-rows 2,999" in r.json()["detail"]
        assert c.post("/v1/tables/ages/neighbors", json={"key": 1}).status_code == 200


def test_without_the_dashboard_its_routes_are_gone_but_docs_stay(database: Path) -> None:
    with client_for(database, dashboard=False) as c:
        for path in ("/dashboard", "/v1/dashboard/summary", "/dashboard/static/dashboard.js"):
            assert c.get(path).status_code == 404, path
        assert c.get("/docs").status_code == 200
        assert "/v1/dashboard/summary" not in c.get("/openapi.json").json()["paths"]


def _no_origin(text: str) -> list[str]:
    """URLs in ``text`` outside licence banners (``/*! ... */``)."""
    text = re.sub(r"/\*!.*?\*/", "", text, flags=re.S)
    return re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}", text)


def test_the_page_and_its_assets_stay_on_this_origin_within_the_js_budget(
    client: TestClient,
) -> None:
    page = client.get("/dashboard")
    assert page.headers["content-security-policy"] == "default-src 'self'"
    assert _no_origin(page.text) == []
    refs = [r for r in re.findall(r'(?:src|href)="([^"]+)"', page.text) if r[0] != "#"]
    assert refs and all(r.startswith("/") and not r.startswith("//") for r in refs), refs
    js = 0
    for ref in refs:
        r = client.get(ref)
        assert r.status_code == 200, ref
        if ref.endswith(".js"):
            js += len(r.content)
        if ref.endswith((".js", ".css")):
            assert r.headers["content-security-policy"] == "default-src 'self'"
            assert _no_origin(r.text) == [], ref
    assert 0 < js < JS_BUDGET
    assert set(PAGE_FILES) <= {p.name for p in STATIC.iterdir()}
    assert client.get("/favicon.ico").headers["content-type"] == "image/png"


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_load_their_assets_from_this_server(client: TestClient, page: str) -> None:
    html = client.get(page).text
    assert _no_origin(html) == [] and "cdn" not in html
    for ref in re.findall(r'(?:src|href)="([^"]+)"', html):
        r = client.get(ref)
        assert r.status_code == 200 and len(r.content) > 0, ref
        assert b"cdn.redoc.ly" not in r.content
    assert client.get("/docs/static/../settings.py").status_code == 404


def test_quantiles_interpolate_within_buckets() -> None:
    buckets = {0.001: 50.0, 0.01: 90.0, 0.1: 100.0, float("inf"): 100.0}
    assert quantile(0.5, buckets) == pytest.approx(0.001)
    assert quantile(0.7, buckets) == pytest.approx(0.001 + 0.009 * 0.5)
    assert quantile(0.99, buckets) == pytest.approx(0.01 + 0.09 * 0.9)
    assert quantile(0.5, {0.1: 0.0, float("inf"): 0.0}) is None
    assert quantile(0.99, {0.1: 1.0, float("inf"): 2.0}) == 0.1  # in +Inf: its lower bound


def test_evdb_serve_no_dashboard(database: Path) -> None:
    with serving(database, "--no-dashboard") as url:
        assert httpx.get(f"{url}/dashboard").status_code == 404
        assert httpx.get(f"{url}/docs").status_code == 200
    with serving(database, "--max-scan-rows", "10") as url:
        r = httpx.post(f"{url}/v1/tables/zipf/neighbors", json={"key": 16})
        assert r.status_code == 422 and "--max-scan-rows 10" in r.json()["detail"]


def test_the_sampler_samples_each_table_ahead_of_any_request(database: Path) -> None:
    with client_for(database, sample_interval_s=0.05) as c:
        views = c.app.state.views
        deadline = time.monotonic() + 60
        while len(views.computed()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert views.computed() == ["ages", "words", "zipf"]


def test_with_two_workers_the_series_sums_both(database: Path) -> None:
    """Every worker's series counts every worker's lookups, as /metrics sums them."""
    with serving(database, "--workers", "2") as url:

        def lookups() -> float:
            series = httpx.get(f"{url}/v1/dashboard/series").json()  # a new connection each
            return float(series["tables"]["zipf"]["lookups"][-1])

        before = lookups()
        pids: set[int] = set()
        n = 0
        while len(pids) < 2 and n < 200:  # until both workers have answered (bounded)
            r = httpx.post(f"{url}/v1/tables/zipf/lookup", json={"keys": [n]})
            assert r.status_code == 200
            n += 1
            pids.add(httpx.get(f"{url}/v1/dashboard/summary").json()["server"]["pid"])
        assert len(pids) == 2, "200 new connections all reached one worker"
        answers = [httpx.get(f"{url}/v1/dashboard/series").json() for _ in range(8)]
        assert {a["tables"]["zipf"]["lookups"][-1] for a in answers} == {before + n}


def test_following_a_publish_root_the_strip_shows_root_seq_and_staleness(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=4)
        t.upsert(np.arange(100), np.ones((100, 4), np.float32))
        db.publish(root)
        with TestClient(create_app(Settings(follow_root=root, poll_interval_s=0.2))) as c:
            server = c.get("/v1/dashboard/summary").json()["server"]
            assert server["publish_root"] == str(root) and server["seq"] == 1
            assert 0 <= server["staleness_s"] < 600
            dist = c.get("/v1/dashboard/tables/item/distributions").json()
            assert dist["rows"] == 100
            r = c.post("/v1/tables/item/neighbors", json={"key": 3, "k": 2}).json()
            assert len(r["keys"]) == 2


def test_following_neighbours_see_the_newest_publication(tmp_path: Path) -> None:
    """Rows a delta changed or removed are answered as the trainer has them at that seq."""
    root = tmp_path / "pub"
    rng = np.random.default_rng(3)
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=4)
        t.upsert(np.arange(200), rng.normal(size=(200, 4)).astype(np.float32))
        db.publish(root)
        with TestClient(create_app(Settings(follow_root=root, poll_interval_s=0.1))) as c:

            def ask(body: dict) -> dict:
                r = c.post("/v1/tables/item/neighbors", json={**body, "k": 5})
                assert r.status_code == 200, r.text
                return r.json()

            before = ask({"key": 7})["keys"]
            # a new row equal to key 7's, key 7's best neighbour removed, key 7 itself moved
            t.upsert([1000], t.lookup([7]))
            t.delete([before[0]])
            t.upsert([7], t.lookup([before[-1]]) + 1e-3)
            assert db.publish(root)["seq"] == 2
            deadline = time.monotonic() + 30
            while c.get("/v1/dashboard/summary").json()["server"].get("seq") != 2:
                assert time.monotonic() < deadline, "the follower did not apply seq 2"
                time.sleep(0.1)
            for body in ({"key": 7}, {"vector": [0.3, -0.2, 0.5, 0.1], "metric": "l2"}):
                want = t.neighbors(
                    body.get("key", body.get("vector")), 5, body.get("metric", "cosine")
                )
                got = ask(body)
                assert got["keys"] == want[0].tolist()
                np.testing.assert_allclose(got["scores"], want[1], rtol=1e-5, atol=1e-6)
            assert before[0] not in ask({"key": 7})["keys"]


def test_a_failed_tick_does_not_stop_the_sampler(database: Path) -> None:
    with client_for(database, sample_interval_s=0.02) as c:
        sampler = c.app.state.sampler
        calls = []

        async def broken() -> None:
            calls.append(1)
            raise RuntimeError("a table closed under the sample")

        sampler.after_tick = broken
        deadline = time.monotonic() + 30
        while len(calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(calls) >= 3  # it went on ticking after the first failure
        assert c.get("/v1/dashboard/series").status_code == 200


def test_following_the_figures_take_each_publication_without_a_new_scan(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    rng = np.random.default_rng(4)
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=4, ttl_steps=100)
        t.upsert(np.arange(300), rng.normal(size=(300, 4)).astype(np.float32))
        db.publish(root, full=True)
        with TestClient(create_app(Settings(follow_root=root, poll_interval_s=0.1))) as c:
            first = c.get("/v1/dashboard/tables/item/distributions").json()
            assert first["rows"] == 300 and first["age"]["counts"][0] == 300
            views = c.app.state.views
            scans = views.samples.scans
            db.advance(100)
            t.upsert(np.arange(1000, 1100), rng.normal(size=(100, 4)).astype(np.float32))
            t.delete(np.arange(50))
            assert db.publish(root)["kind"] == "delta"
            deadline = time.monotonic() + 30
            while c.get("/v1/dashboard/summary").json()["server"].get("seq") != 2:
                assert time.monotonic() < deadline, "the follower did not apply seq 2"
                time.sleep(0.1)
            d = c.get("/v1/dashboard/tables/item/distributions").json()
            assert views.samples.scans == scans  # the full was not scanned again
            assert d["rows"] == len(t) == 350
            counts = d["age"]["counts"]
            assert counts[0] == 100 and counts[-1] == 250 and sum(counts) == 350
            labels = set(c.get("/v1/dashboard/tables/item/projection").json()["labels"])
            assert {"1000", "1099"} <= labels and not labels & {"0", "49"}
