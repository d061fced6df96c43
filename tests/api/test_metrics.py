"""``/metrics``: the reads each tier answered, per table, operation and tier (issue 31), as
Prometheus counters equal to ``Table.stats()``, and the dashboard's hit rates from the same."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("fastapi")

from prometheus_client.parser import text_string_to_metric_families

from .test_routes import ABSENT, PRESENT


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of counter ``name`` (``_total``) in a scrape, by their sorted labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def served_stats(client: Any, table: str) -> dict[str, Any]:
    snap = client.app.state.holder.current
    stats: dict[str, Any] = snap.tables[table].stats()
    return stats


def test_reads_by_table_op_and_tier_equal_stats(client) -> None:
    keys = [*PRESENT, *ABSENT]
    for _ in range(2):  # the first read promotes the present keys from RocksDB into DRAM
        assert client.post("/v1/tables/item/lookup", json={"keys": keys}).status_code == 200
    text = client.get("/metrics").text
    reads = samples(text, "evdb_reads_total")
    stats = served_stats(client, "item")
    want = {
        (("op", op), ("table", "item"), ("tier", tier)): float(n)
        for op, by_tier in stats["reads"].items()
        for tier, n in by_tier.items()
    }
    assert {k: v for k, v in reads.items() if ("table", "item") in k} == want
    lookup = stats["reads"]["lookup"]
    assert lookup["not_found"] == 2 * len(ABSENT)
    assert lookup["dram"] + lookup.get("rocksdb", 0) == 2 * len(PRESENT)
    assert lookup["dram"] >= len(PRESENT)  # the second round hit DRAM
    # the cache tiers' hits and misses, split by operation
    hits = samples(text, "evdb_tier_hits_total")
    misses = samples(text, "evdb_tier_misses_total")
    dram = stats["tiers"]["dram"]
    for op in ("pull", "lookup"):
        key = (("op", op), ("table", "item"), ("tier", "dram"))
        assert hits[key] == dram[f"{op}_hits"] and misses[key] == dram[f"{op}_misses"]
    assert dram["lookup_hits"] == lookup["dram"] > 0
    # the same series in the text format's own words
    assert 'evdb_reads_total{op="lookup",table="item",tier="not_found"}' in text
    assert "# TYPE evdb_reads_total counter" in text
    # RocksDB is not a cache tier: no hits/misses series of its own
    assert not any(("tier", "rocksdb") in k for k in hits)


def test_the_dashboard_summary_gives_hit_rates_per_tier_from_the_same_counts(client) -> None:
    for _ in range(3):
        client.post("/v1/tables/item/lookup", json={"keys": [*PRESENT, *ABSENT]})
    body = client.get("/v1/dashboard/summary").json()
    item = next(t for t in body["tables"] if t["name"] == "item")
    stats = item["stats"]
    rates = item["hit_rates"]
    dram = stats["tiers"]["dram"]
    asked = dram["lookup_hits"] + dram["lookup_misses"]
    assert rates["dram"]["lookup"] == pytest.approx(dram["lookup_hits"] / asked)
    assert rates["dram"]["pull"] is None  # nothing pulled: no rate, not 0
    reads = stats["reads"]["lookup"]
    assert item["reads"]["lookup"] == reads
    assert item["found_rate"]["lookup"] == pytest.approx(
        1 - reads["not_found"] / sum(reads.values())
    )


def test_a_databases_writer_counts_are_not_this_servers(tmp_path) -> None:
    """A database carries its writer's read counts; /metrics and the dashboard count this
    server's reads only, from when it opened the table."""
    import numpy as np
    from fastapi.testclient import TestClient

    import evdb
    from evdb.api import Settings, create_app

    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=2, dram_rows=64)
        t.upsert(np.arange(100), np.ones((100, 2), np.float32))
        t.lookup(np.arange(500))  # the writer's 400 keys not found, 100 found
        t.pull(np.arange(30))
    with evdb.open(tmp_path / "db", read_only=True) as db:
        writer = db.table("item").stats()["reads"]
    assert writer["lookup"]["not_found"] == 400  # they are saved with the database
    for dashboard in (False, True):
        with TestClient(create_app(Settings(path=tmp_path / "db", dashboard=dashboard))) as c:
            c.post("/v1/tables/item/lookup", json={"keys": [1, 2, 1000]})
            reads = samples(c.get("/metrics").text, "evdb_reads_total")
            lookup = {dict(k)["tier"]: v for k, v in reads.items() if ("op", "lookup") in k}
            assert sum(lookup.values()) == 3 and lookup["not_found"] == 1
            assert sum(v for k, v in reads.items() if ("op", "pull") in k) == 0
            if dashboard:
                card = c.get("/v1/dashboard/summary").json()["tables"][0]
                assert card["reads"]["lookup"] == {k: int(v) for k, v in lookup.items()}
                assert card["found_rate"]["lookup"] == pytest.approx(2 / 3)
                assert card["hit_rates"]["dram"]["pull"] is None
