"""The table's private pull/push bookkeeping kernels (``cpu.stamp``) == ``reference.stamp``."""

from __future__ import annotations

import numpy as np
import pytest

from evdb.kernels.cpu import stamp as cpu_stamp
from evdb.kernels.reference import stamp as ref_stamp
from evdb.records import FREQ_MAX, FROZEN


def columns(rng: np.random.Generator, n_rows: int) -> dict[str, np.ndarray]:
    """A DRAM tier's metadata columns with random contents (some freq near saturation)."""
    freq = rng.integers(0, 1000, n_rows).astype(np.uint32)
    freq[rng.random(n_rows) < 0.1] = FREQ_MAX - rng.integers(0, 3, 1).astype(np.uint32)
    return {
        "freq": freq,
        "last_step": rng.integers(-5, 50, n_rows).astype(np.int64),
        "versions": rng.integers(0, 2**40, n_rows).astype(np.uint64),
        "is_dirty": rng.random(n_rows) < 0.5,
        "flags": (rng.random(n_rows) < 0.2).astype(np.uint8) * FROZEN
        | (rng.random(n_rows) < 0.3).astype(np.uint8) * np.uint8(2),
    }


def batch_rows(rng: np.random.Generator, n_rows: int, u: int) -> np.ndarray:
    """u distinct rows of the slab, some -1 (keys without a row)."""
    rows = rng.permutation(n_rows)[:u].astype(np.int64)
    rows[rng.random(u) < 0.3] = -1
    return rows


@pytest.mark.parametrize(
    "n_rows,u,dim",
    [(1, 0, 3), (1, 1, 1), (50, 40, 5), (20_000, 5_000, 64), (70_000, 40_000, 17)],
)
def test_stamp_gather_pulled_matches_reference(rng, n_rows, u, dim) -> None:
    """Serial (small) and parallel (from 4,096 rows) variants alike: every column stamped as
    the reference does, out gathered, and entries without a row left untouched."""
    base = columns(rng, n_rows)
    base["is_pinned"] = rng.random(n_rows) < 0.1
    values = rng.standard_normal((n_rows, dim)).astype(np.float32)
    rows = batch_rows(rng, n_rows, u)
    counts = rng.integers(1, 6, u).astype(np.int64)
    step, version = int(rng.integers(0, 100)), int(rng.integers(1, 2**40))
    outs = []
    for mod in (ref_stamp, cpu_stamp):
        c = {k: v.copy() for k, v in base.items()}
        out = np.full((u, dim), 7.0, dtype=np.float32)
        n = mod.stamp_gather_pulled(
            rows.copy(), counts, step, version, int(FREQ_MAX), c["freq"], c["last_step"],
            c["versions"], c["is_dirty"], c["is_pinned"], values, out,
        )  # fmt: skip
        outs.append((n, c, out))
    assert outs[0][0] == outs[1][0] == int(np.count_nonzero(rows >= 0))
    for name in base:
        np.testing.assert_array_equal(outs[1][1][name], outs[0][1][name], err_msg=name)
    np.testing.assert_array_equal(outs[1][2], outs[0][2])
    have = rows >= 0
    assert (outs[0][1]["freq"][rows[have]] <= FREQ_MAX).all()
    assert outs[0][1]["is_pinned"][rows[have]].all()
    np.testing.assert_array_equal(outs[1][2][have], values[rows[have]])
    assert (outs[1][2][~have] == 7.0).all()


@pytest.mark.parametrize("n_rows,u", [(1, 0), (1, 1), (50, 40), (20_000, 5_000)])
def test_stamp_pushed_matches_reference(rng, n_rows, u) -> None:
    base = columns(rng, n_rows)
    rows = batch_rows(rng, n_rows, u)
    step, version = int(rng.integers(0, 100)), int(rng.integers(1, 2**40))
    outs = []
    for mod in (ref_stamp, cpu_stamp):
        c = {k: v.copy() for k, v in base.items()}
        r = rows.copy()
        counted = mod.stamp_pushed(
            r, c["flags"], int(FROZEN), step, version,
            c["last_step"], c["versions"], c["is_dirty"],
        )  # fmt: skip
        outs.append((tuple(int(x) for x in counted), r, c))
    assert outs[0][0] == outs[1][0]
    np.testing.assert_array_equal(outs[1][1], outs[0][1])
    for name in base:
        np.testing.assert_array_equal(outs[1][2][name], outs[0][2][name], err_msg=name)
    have = rows >= 0
    frozen = np.zeros(u, dtype=bool)
    frozen[have] = (base["flags"][rows[have]] & FROZEN) != 0
    assert outs[0][0] == (int(np.count_nonzero(~have)), int(np.count_nonzero(frozen)))
    np.testing.assert_array_equal(outs[0][1], np.where(frozen, -1, rows))


@pytest.mark.parametrize("ttl_steps", [None, 3])
@pytest.mark.parametrize("admission", [None, "counter"])
def test_pull_dedups_the_same_either_way(tmp_path, monkeypatch, rng, admission, ttl_steps) -> None:
    # Table.pull deduplicates small batches before probing the index and big ones by row
    # after probing every key; both ways must give the same Pulled and leave the same rows.
    import evdb
    import evdb.table

    batches = [rng.integers(0, 3000, int(rng.integers(1, 5000))) for _ in range(8)]
    batches[3] = batches[3][:0]  # an empty pull too
    results = []
    for limit in (evdb.table._DEDUP_FIRST, 0):
        monkeypatch.setattr(evdb.table, "_DEDUP_FIRST", limit)
        with evdb.open(tmp_path / f"db{limit}") as db:
            opts: dict = {"ttl_steps": ttl_steps}
            if admission is not None:
                opts["admission"] = evdb.admission.Counter(min_count=2)
            t = db.create_table("t", dim=3, **opts)
            seen = []
            for keys in batches:
                p = t.pull(keys)
                t.push(p, np.ones((p.keys.shape[0], 3)))
                seen.append((p.keys, p.inverse, p.counts, p.admitted, p.rows))
                db.advance()
            found, records = t._read_records(np.arange(3000))
            results.append((seen, found, records, len(t), t.stats()))
    (a, fa, ra, na, sa), (b, fb, rb, nb, sb) = results
    assert na == nb
    np.testing.assert_array_equal(fa, fb)
    for f in ("values", "slots", "freq", "last_step"):
        np.testing.assert_array_equal(getattr(ra, f), getattr(rb, f), err_msg=f)
    assert sa["tiers"] == sb["tiers"] and sa["admission"] == sb["admission"]
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x, y, strict=True):
            np.testing.assert_array_equal(u, v)
