"""The dashboard and /docs in a real headless browser: Debian's chromium driven by selenium
through chromium-driver (explicit paths; nothing downloads a browser), against a live
``evdb serve`` on 127.0.0.1. One browser for the module; every wait is bounded.

Where chromium, chromium-driver or selenium is missing these tests skip, saying which, except
under CI (``CI=true``), where they fail: ``.ci/run`` installs them.

``EVDB_SCREENSHOT_DIR=docs EVDB_SCREENSHOT_SNAPSHOT=.evdb-example/checkpoint`` makes
``test_screenshots`` write the README's pictures (one per view) from that snapshot.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import evdb

from .dashboard_data import AGES_TTL, ZIPF_SLOPE, build_database, serving, words

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
VIEWS = ("overview", "distributions", "projector")
WAIT_S = 5  # the bound: every chart has a drawn canvas within 5 s


def _missing() -> list[str]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (os.access(p, os.X_OK))]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install 'evdb[test]')")
    return missing


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = _missing()
    if missing:
        reason = f"no headless browser here: missing {', '.join(missing)}"
        if os.environ.get("CI") == "true":  # .ci/run installs them: a missing one is a bug
            pytest.fail(reason + " (CI installs chromium and chromium-driver in .ci/run)")
        pytest.skip(reason + " (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--disable-gpu", "--hide-scrollbars"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_database(tmp_path_factory.mktemp("dashboard") / "db")


@pytest.fixture(scope="module")
def url(database: Path, browser: Any) -> Iterator[str]:
    with serving(database) as u:
        yield u


@pytest.fixture(scope="module")
def reference(database: Path) -> Iterator[evdb.Database]:
    with evdb.open(database, read_only=True) as db:
        yield db


def wait(driver: Any, script: str, timeout: float = WAIT_S) -> Any:
    """The first truthy value of ``script`` (run in the page), polled for at most
    ``timeout`` seconds."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(
        lambda d: d.execute_script(script)
    )


def open_view(driver: Any, url: str, view: str, table: str = "zipf") -> None:
    driver.get(f"{url}/dashboard?table={table}#{view}")
    wait(driver, "return document.body.dataset.ready === '1'", 15)


# How many charts of the visible view have a canvas with something drawn on it, and how many
# charts there are.
DRAWN = """
const view = document.querySelector('.view:not([hidden])');
const charts = [...view.querySelectorAll('.chart')];
const drawn = charts.filter((c) => {
  const cv = c.querySelector('canvas');
  if (!cv || !cv.width || !cv.height) return false;
  const px = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
  for (let i = 3; i < px.length; i += 4) if (px[i]) return true;
  return false;
});
return charts.length > 0 && drawn.length === charts.length ? charts.length : 0;
"""

RESOURCES = "return performance.getEntriesByType('resource').map((e) => e.name)"


def errors(driver: Any) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def test_every_chart_is_drawn_and_the_console_stays_clean(browser: Any, url: str) -> None:
    browser.get_log("browser")  # start from an empty log
    for view in VIEWS:
        open_view(browser, url, view)
        assert wait(browser, DRAWN) >= 1, view
        others = [r for r in browser.execute_script(RESOURCES) if not r.startswith(url + "/")]
        assert others == [], (view, others)
    assert errors(browser) == []


def test_the_summary_equals_stats(browser: Any, url: str, reference: evdb.Database) -> None:
    open_view(browser, url, "overview")
    for name in reference.tables():
        stats = reference.table(name).stats()
        card = f'[data-table="{name}"]'

        def text(sel: str, card: str = card) -> str:
            script = f"return document.querySelector('{sel}').textContent"
            return str(browser.execute_script(script))

        assert text(f'{card} [data-stat="rows"]') == f"{stats['rows']:,}"
        assert text(f'{card} [data-stat="dim"]') == str(stats["dim"])
        assert text(f'{card} [data-stat="key_type"]') == reference.table(name).config.key_type
        for tier, level in stats["tiers"].items():
            shown = text(f'{card} [data-tier="{tier}"]')
            assert shown.startswith(f"{level['rows']:,}")
            # a cache tier's hit rates, lookups and pulls apart; not RocksDB's (no cache)
            assert ("hit rate: lookups" in shown) == ("lookup_hits" in level), shown


def test_n_lookups_raise_the_request_series_by_n(browser: Any, url: str) -> None:
    open_view(browser, url, "overview")
    before = httpx.get(f"{url}/v1/dashboard/series").json()["tables"]["zipf"]["lookups"][-1]
    n = 7
    for i in range(n):
        r = httpx.post(f"{url}/v1/tables/zipf/lookup", json={"keys": [16, i, 27]})
        assert r.status_code == 200
    # the page refreshes every sample interval (1 s here): bounded wait for it to show them
    script = "const v = document.getElementById('chart-rate-zipf').dataset.lookups;"
    shown = wait(browser, f"{script} return Number(v) === {before + n} && v", 10)
    assert float(shown) == before + n


def test_zipf_pulls_show_their_slope(browser: Any, url: str) -> None:
    open_view(browser, url, "distributions", "zipf")
    slope = float(wait(browser, "return document.getElementById('slope').dataset.slope"))
    assert abs(slope - ZIPF_SLOPE) <= 0.15


def test_what_a_table_has_not_got_is_said_not_drawn(browser: Any, url: str) -> None:
    """``words`` was upserted, never pulled, all at one step, without a TTL: no counts and no
    ages, so no empty axes, and the notes say why."""
    open_view(browser, url, "distributions", "words")
    script = "const n = document.getElementById('frequency-note').textContent;"
    note = wait(browser, f"{script} return n.includes('No pull counts') && n")
    assert "2,000 rows sampled of 2,000" in note
    hidden = (
        "return ['chart-frequency', 'chart-age'].map((id) => document.getElementById(id).hidden)"
    )
    assert browser.execute_script(hidden) == [True, True]
    age_note = browser.execute_script("return document.getElementById('age-note').textContent")
    assert "no ages to show" in age_note
    assert browser.execute_script("return document.getElementById('slope').textContent") == ""
    assert errors(browser) == []


def test_rows_at_two_ages_fill_the_first_and_last_buckets(browser: Any, url: str) -> None:
    open_view(browser, url, "distributions", "ages")
    counts = json.loads(wait(browser, "return document.getElementById('chart-age').dataset.counts"))
    assert counts[0] == 500 and counts[-1] == 500 and sum(counts[1:-1]) == 0
    ttl = browser.execute_script("return document.getElementById('ttl').textContent")
    assert str(AGES_TTL) in ttl


def test_the_neighbours_box_shows_table_neighbors(
    browser: Any, url: str, reference: evdb.Database
) -> None:
    from selenium.webdriver.common.by import By

    open_view(browser, url, "projector", "words")
    wait(browser, DRAWN)
    query = words()[0][10]
    box = browser.find_element(By.ID, "nn-key")
    box.clear()
    box.send_keys(query)
    browser.find_element(By.CSS_SELECTOR, "#nn-form button").click()
    wait(browser, "return document.querySelectorAll('#nn-list li').length === 10")
    shown = browser.execute_script(
        "return [...document.querySelectorAll('#nn-list li')].map((li) => li.dataset.key)"
    )
    keys, _ = reference.table("words").neighbors(query, k=10)
    assert shown == [str(k) for k in keys.tolist()]
    labels = browser.execute_script(
        "return [...document.querySelectorAll('#nn-list li')].map((li) => li.firstChild.data)"
    )
    assert labels == reference.table("words").strings(keys)
    assert errors(browser) == []


def test_hovering_a_point_names_its_key(browser: Any, url: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    open_view(browser, url, "projector", "zipf")
    wait(browser, DRAWN)
    # a point's position in CSS pixels, and the labels of every point drawn within 1 px of it
    x, y, near = browser.execute_script(
        """const c = document.getElementById('projection'), p = state.projection;
        const at = projectionFrame(c, p), r = devicePixelRatio, [x, y] = at(0);
        const near = p.labels.filter((_, i) => Math.hypot(at(i)[0] - x, at(i)[1] - y) <= r);
        return [x / r, y / r, near];"""
    )
    canvas = browser.find_element(By.ID, "projection")
    size = canvas.size
    ActionChains(browser).move_to_element_with_offset(
        canvas, int(x - size["width"] / 2), int(y - size["height"] / 2)
    ).perform()
    tip = wait(
        browser, "const t = document.getElementById('hover'); return !t.hidden && t.textContent"
    )
    assert tip in near


@pytest.mark.parametrize(("page", "ready"), [
    ("docs", "return document.querySelectorAll('.opblock').length"),
    ("redoc", "return document.querySelectorAll('[role=menuitem]').length"),
])  # fmt: skip
def test_docs_render_offline(browser: Any, url: str, page: str, ready: str) -> None:
    browser.get_log("browser")
    browser.get(f"{url}/{page}")
    assert wait(browser, ready, 15) > 3
    others = [r for r in browser.execute_script(RESOURCES) if not r.startswith(url + "/")]
    assert others == []
    assert errors(browser) == []


def test_screenshots(browser: Any, url: str, tmp_path: Path) -> None:
    """One picture per view (the README's, with EVDB_SCREENSHOT_DIR and _SNAPSHOT set)."""
    out = Path(os.environ.get("EVDB_SCREENSHOT_DIR") or tmp_path)
    snapshot = os.environ.get("EVDB_SCREENSHOT_SNAPSHOT")
    if snapshot:
        with serving(Path(snapshot)) as other:
            _screenshots(browser, other, out, "item")
    else:
        _screenshots(browser, url, out, "zipf")


def _screenshots(browser: Any, url: str, out: Path, table: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # Lookups of varying size over some samples (1 s apart), so the series have a shape; the
    # README's pictures get half a minute of them, the suite's run a few.
    rounds = 60 if os.environ.get("EVDB_SCREENSHOT_DIR") else 3
    rng = np.random.default_rng(0)
    for i in range(rounds):
        for _ in range(1 + i % 7):
            keys = rng.zipf(1.3, size=200) % 2000
            httpx.post(f"{url}/v1/tables/{table}/lookup", json={"keys": keys.tolist()})
        time.sleep(0.5)
    browser.set_window_size(1400, 1100)
    try:
        for view in VIEWS:
            open_view(browser, url, view, table)
            wait(browser, DRAWN)
            if view == "projector":  # a neighbours query, to show the box at work
                from selenium.webdriver.common.by import By

                label = browser.execute_script("return state.projection.labels[0]")
                browser.find_element(By.ID, "nn-key").send_keys(label)
                browser.find_element(By.CSS_SELECTOR, "#nn-form button").click()
                wait(browser, "return document.querySelectorAll('#nn-list li').length > 0")
            path = out / f"dashboard-{view}.png"
            assert browser.save_screenshot(str(path))
            assert path.stat().st_size > 10_000
    finally:
        browser.set_window_size(1400, 1000)


def test_following_the_page_shows_one_version(browser: Any, tmp_path: Path) -> None:
    """A follower at a delta: the strip's seq is the distributions' version, the slope is not
    fitted over another version's counts, and the tiers say they hold the full plus an
    overlay."""
    root = tmp_path / "pub"
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=4)
        t.pull(np.repeat(np.arange(1, 200), 3))
        db.publish(root, full=True)
        t.upsert(np.arange(1000, 1050), np.ones((50, 4), np.float32))
        assert db.publish(root)["seq"] == 2
    with serving(root, "--follow") as u:
        open_view(browser, u, "distributions", "item")
        version = wait(
            browser, "return document.getElementById('view-distributions').dataset.version"
        )
        seq = browser.execute_script(
            "return document.querySelector('[data-field=\"seq\"] b').textContent"
        )
        assert version == seq == "2"
        note = browser.execute_script(
            "return document.getElementById('frequency-note').textContent"
        )
        assert "249 rows sampled of 249" in note and "deltas carry no pull counts" in note
        assert browser.execute_script("return document.getElementById('chart-frequency').hidden")
        open_view(browser, u, "overview", "item")
        overlay = wait(
            browser,
            "const o = document.querySelector('[data-tier=\"overlay\"]');"
            " return o && o.textContent",
        )
        assert overlay.startswith("50 rows and removals since full seq 1")
        assert errors(browser) == []


def test_bytes_a_row_by_component_are_shown(browser: Any, url: str) -> None:
    """Each tier's bytes a row by component (``Table.stats()``) on its table's card, as the
    summary the page read says them (not for a tier without rows: its index over no rows)."""
    open_view(browser, url, "overview")
    shown = browser.execute_script(
        """return [...document.querySelectorAll('[data-row-bytes] [data-tier]')].map((s) =>
           [s.closest('[data-row-bytes]').dataset.rowBytes, s.dataset.tier,
            JSON.parse(s.dataset.components), s.textContent]);"""
    )
    summary = browser.execute_script("return state.summary")
    want = {
        (t["name"], tier): level["bytes_per_row_by_component"]
        for t in summary["tables"]
        for tier, level in t["stats"]["tiers"].items()
        if "bytes_per_row_by_component" in level and level["rows"]
    }
    assert want and {(name, tier): parts for name, tier, parts, _ in shown} == want
    for _, tier, parts, text in shown:
        assert text.startswith(f"{tier}: ") and " B a row = " in text, text
        assert sorted(p.split(" ")[0] for p in text.split(" = ")[1].split(" + ")) == sorted(parts)


def test_the_sizing_view_draws_a_trace(
    browser: Any, url: str, database: Path, tmp_path: Path
) -> None:
    """A trace picked in the Sizing view is analysed by the server and drawn: the chart's
    points and the targets' rows are the route's answer for the same file."""
    from selenium.webdriver.common.by import By

    from .test_dashboard_sizing import record

    with evdb.open(database, read_only=True) as db:
        config = db.table("zipf").config
    config = dataclasses.replace(config, dram=evdb.DramConfig(capacity_rows=300))
    path = record(tmp_path / "zipf.trace", "zipf", config, seed=7)
    browser.get_log("browser")
    open_view(browser, url, "sizing", "zipf")
    browser.find_element(By.ID, "sizing-file").send_keys(str(path))
    browser.find_element(By.CSS_SELECTOR, "#sizing-form button").click()
    wait(browser, "return !document.getElementById('sizing-result').hidden", 60)
    assert wait(browser, DRAWN) == 1
    answer = httpx.post(
        f"{url}/v1/dashboard/tables/zipf/sizing",
        content=path.read_bytes(),
        headers={"content-type": "application/octet-stream"},
        timeout=60,
    ).json()
    report = answer["report"]
    points = json.loads(
        browser.execute_script("return document.getElementById('chart-sizing').dataset.points")
    )
    assert points == [[c["dram_rows"], c["evdb_hit_rate"]] for c in report["curve"]]
    rows = browser.execute_script(
        """return [...document.querySelectorAll('#sizing-targets tbody tr')].map((tr) =>
           [tr.dataset.target, ...[...tr.children].slice(1).map((td) => td.textContent)]);"""
    )
    fmt = lambda n: "not reached" if n is None else f"{n:,}"  # noqa: E731
    assert rows == [
        [t, fmt(v["evdb_rows"]), fmt(v["lru_rows"])] for t, v in report["targets"].items()
    ]
    facts = browser.execute_script("return document.getElementById('sizing-facts').textContent")
    assert "dram_rows now 300" in facts and "configuration differs" in facts
    assert errors(browser) == []


def test_the_sizing_view_says_why_a_file_is_refused(browser: Any, url: str, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    bad = tmp_path / "keys.trace"
    bad.write_bytes(b"not a trace at all")
    open_view(browser, url, "sizing", "zipf")
    browser.find_element(By.ID, "sizing-file").send_keys(str(bad))
    browser.find_element(By.CSS_SELECTOR, "#sizing-form button").click()
    script = "const e = document.getElementById('sizing-error'); return !e.hidden && e.textContent"
    assert "not an evdb key trace" in wait(browser, script, 30)
