"""The grouped exchange (``ShardedCollection``, and ``EmbeddingBagCollection`` over sharded
tables): N ranks equal one process bit for bit in float32, equal the per-table calls bit for
bit, 16-bit payloads round what crosses and nothing else, and failures raise on every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.distributed import group_workers as gw
from tests.distributed.harness import run_ranks

dist = pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch without distributed")
torch = pytest.importorskip("torch")

FIELDS = ("keys", "values", "slots", "freq", "last_step", "pending_keys", "pending_counts")


def records(files: list[Path]) -> dict[str, dict[str, np.ndarray]]:
    """Every table's records over the shards, sorted by key (pending admissions too)."""
    parts = [dict(np.load(f)) for f in files]
    names = {k.split(".")[0] for k in parts[0]}
    out: dict[str, dict[str, np.ndarray]] = {}
    for name in names:
        keys = np.concatenate([p[f"{name}.keys"] for p in parts])
        order = np.argsort(keys)
        table = {"keys": keys[order]}
        for f in ("values", "slots", "freq", "last_step"):
            table[f] = np.concatenate([p[f"{name}.{f}"] for p in parts])[order]
        pk = np.concatenate([p[f"{name}.pending_keys"] for p in parts])
        po = np.argsort(pk)
        table["pending_keys"] = pk[po]
        table["pending_counts"] = np.concatenate([p[f"{name}.pending_counts"] for p in parts])[po]
        out[name] = table
    return out


def assert_bit_equal(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    assert sorted(got) == sorted(want), what
    for name in want:
        for f in FIELDS:
            g, w = got[name][f], want[name][f]
            assert g.dtype == w.dtype and g.shape == w.shape, (what, name, f)
            assert g.tobytes() == w.tobytes(), f"{what}: {name}.{f} differs"


def rounded(x: np.ndarray, payload: str) -> np.ndarray:
    from evdb.distributed.group import PAYLOAD_DTYPES

    wire = PAYLOAD_DTYPES[payload]
    out: np.ndarray = torch.from_numpy(x).to(wire).to(torch.float32).numpy()
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("group-reference")
    out: dict[str, Any] = {}
    for exact in (True, False):
        db, last = gw.train_reference(root / f"db-{exact}", exact)
        gw.dump_records(db, root / f"records-{exact}.npz")
        out[exact] = {"records": records([root / f"records-{exact}.npz"]), "pulled": last}
        out[exact]["len"] = {n: len(db.table(n)) for n in gw.TABLES}
        db.close()
    return out


def pulled(out: Path, mode: str, name: str, world: int) -> np.ndarray:
    return np.concatenate([np.load(out / f"pulled-{mode}-{name}-{r}.npy") for r in range(world)])


@pytest.mark.parametrize("world", [2, 3])
def test_grouped_equals_one_process_bit_for_bit(tmp_path: Path, world: int, reference) -> None:
    """Exact gradients (partial sums exact in float32 and bfloat16): the grouped float32
    exchange and the per-table calls leave one process's tables, bit for bit; 16-bit payloads
    change only the rows the ranks read (the payload's rounding of the stored rows)."""
    results = run_ranks(gw.train, world, tmp_path, True)
    want = reference[True]
    for mode in gw.MODES:
        shards = [tmp_path / f"{mode}-shard-{r}.npz" for r in range(world)]
        assert_bit_equal(records(shards), want["records"], f"{mode} on {world} ranks")
        assert all(r[mode] == want["len"] for r in results)
        for name in gw.TABLES:
            got = pulled(tmp_path, mode, name, world)
            expect = want["pulled"][name]
            if mode in ("bfloat16", "float16"):
                expect = rounded(expect, mode)
                assert not np.array_equal(expect, want["pulled"][name])  # rounding showed
            assert got.tobytes() == expect.tobytes(), (mode, name)


def test_grouped_equals_per_table_and_16_bit_payloads_round(tmp_path: Path, reference) -> None:
    """Any gradients: the grouped float32 exchange equals the per-table calls bit for bit
    (the owners run the same pulls and pushes); one process only up to summation order; a
    16-bit payload also rounds each rank's gradient sums, so the rows drift a little."""
    run_ranks(gw.train, 2, tmp_path, False)
    got = {m: records([tmp_path / f"{m}-shard-{r}.npz" for r in range(2)]) for m in gw.MODES}
    assert_bit_equal(got["grouped"], got["per_table"], "grouped vs per-table")
    want = reference[False]["records"]
    for name in gw.TABLES:
        np.testing.assert_allclose(
            got["grouped"][name]["values"], want[name]["values"], rtol=1e-5, atol=1e-6
        )
    for payload, tol in (("bfloat16", 3e-2), ("float16", 5e-3)):
        for name in gw.TABLES:
            g, w = got[payload][name], got["grouped"][name]
            np.testing.assert_array_equal(g["keys"], w["keys"])  # the same rows exist
            np.testing.assert_array_equal(g["freq"], w["freq"])
            np.testing.assert_allclose(g["values"], w["values"], rtol=tol, atol=tol)
        drift = max(
            np.abs(got[payload][n]["values"] - got["grouped"][n]["values"]).max() for n in gw.TABLES
        )
        assert drift > 0, payload  # the rounded gradients did change the rows


def test_a_failing_rank_makes_every_rank_raise(tmp_path: Path) -> None:
    seen = run_ranks(gw.misuse, 2, tmp_path)
    for what in ("float_key", "unknown_table", "outside_div"):
        assert seen[0][what][0] == "CollectiveError", what
        assert "rank 1 refused its input to the group_pull" in seen[0][what][1]
        assert seen[1][what][0] in ("InvalidTypeError", "InvalidArgumentError"), what
    assert "batch['c']" in seen[1]["unknown_table"][1]
    assert "outside the 'div' placement" in seen[1]["outside_div"][1]
    assert seen[0]["missing_grads"][0] == "InvalidArgumentError"
    assert "no gradients for 'b'" in seen[0]["missing_grads"][1]
    assert seen[1]["missing_grads"][0] == "CollectiveError"
    for r in (0, 1):
        assert seen[r]["len_after_refusals"] == [0, 0]  # nothing was pulled
        assert seen[r]["double_push"][0] == "InvalidArgumentError"
        assert "pushed already" in seen[r]["double_push"][1]
        assert seen[r]["row_changed_by_double_push"] is False
        assert "through the collection's push" in seen[r]["part_through_table"][1]
        assert seen[r]["mismatch"][0] == "CollectiveError"
        assert "not in the same collective call" in seen[r]["mismatch"][1]
        assert seen[r]["other_collection"][0] == "CollectiveError"
        assert seen[r]["len_end"] == seen[0]["len_end"]
        for what, words in (
            ("twice", "'a' is given twice"),
            ("empty", "at least one"),
            ("payload", "payload_dtype must be one of"),
            ("not_sharded", "tables[1] must be a ShardedTable"),
        ):
            assert seen[r][f"config_{what}"][0] == "ConfigError", what
            assert words in seen[r][f"config_{what}"][1], what


def test_module_payload_needs_sharded_tables(tmp_path: Path) -> None:
    """Over ordinary tables the module makes no collection, and a 16-bit payload (which only
    the grouped exchange has) is refused naming the condition."""
    import evdb
    from evdb.torch import EmbeddingBagCollection

    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=4)
        assert EmbeddingBagCollection({"f": t}).collection is None
        with pytest.raises(ValueError, match="applies to the grouped exchange of sharded"):
            EmbeddingBagCollection({"f": t}, payload_dtype="bfloat16")
        with pytest.raises(ValueError, match="payload_dtype must be one of"):
            EmbeddingBagCollection({"f": t}, payload_dtype="fp8")


def test_a_dead_rank_fails_the_grouped_call(tmp_path: Path) -> None:
    results = run_ranks(gw.killed, 2, tmp_path, expect_fail={1}, timeout=120)
    assert "failed in a collective" in results[0]["error"]


@pytest.mark.parametrize("payload", ["float32", "bfloat16"])
def test_embedding_bag_collection_groups_its_tables(tmp_path: Path, payload: str) -> None:
    """Three features over two sharded tables: the grouped module leaves the per-table
    module's tables (bit for bit in float32) with 5 collectives a step instead of 10."""
    counts = run_ranks(gw.torch_collection, 2, tmp_path, payload)
    assert counts[0] == {"True": 5, "False": 10}
    got = {
        g: records([tmp_path / f"torch-{g}-shard-{r}.npz" for r in range(2)])
        for g in ("True", "False")
    }
    if payload == "float32":
        assert_bit_equal(got["True"], got["False"], "grouped module vs per-table module")
    else:
        for name in got["False"]:
            np.testing.assert_array_equal(got["True"][name]["keys"], got["False"][name]["keys"])
            np.testing.assert_allclose(
                got["True"][name]["values"], got["False"][name]["values"], rtol=3e-2, atol=3e-2
            )


def test_pipeline_equals_the_plain_loop(tmp_path: Path) -> None:
    """Batch i+1's keys sent (and its rows prefetched) while batch i computes: every pulled
    row and every stored record equal the plain loop's, bit for bit."""
    used = run_ranks(gw.pipelined, 2, tmp_path)
    for r in range(2):
        plain = dict(np.load(tmp_path / f"pulls-False-{r}.npz"))
        piped = dict(np.load(tmp_path / f"pulls-True-{r}.npz"))
        assert sorted(plain) == sorted(piped)
        for k in plain:
            assert plain[k].tobytes() == piped[k].tobytes(), k
    got = {
        p: records([tmp_path / f"piped-{p}-shard-{r}.npz" for r in range(2)])
        for p in ("False", "True")
    }
    assert_bit_equal(got["True"], got["False"], "pipeline vs plain loop")
    assert sum(u["True"] for u in used) > 0  # the owners read rows ahead


def test_the_sharded_movielens_example_trains(tmp_path: Path) -> None:
    """One table per feature, one grouped exchange a step: it learns (held-out AUC above
    chance), and the pipelined loop trains the very same model as the module."""
    lines = run_ranks(gw.example, 2, tmp_path, timeout=400)[0]
    for how in ("module", "pipeline"):
        assert "one grouped exchange (bfloat16 payloads" in lines[how][0]
        epoch = lines[how][1]
        assert float(epoch.split("held-out AUC ")[1].split(",")[0]) > 0.6, epoch
    same = [ln.split(", ")[:2] for ln in (lines["module"][1], lines["pipeline"][1])]
    assert same[0] == same[1]  # train loss and AUC, to the printed digits
