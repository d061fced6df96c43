"""Table.pull's two ways to deduplicate a batch give the same pull (the stamp and dedup
kernels themselves are compared with the reference in the parity table, ``cases.py``)."""

from __future__ import annotations

import numpy as np
import pytest


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
    for limit in (evdb.table.DEDUP_FIRST_KEYS, 0):
        monkeypatch.setattr(evdb.table, "DEDUP_FIRST_KEYS", limit)
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
            found, records = t.read_records(np.arange(3000))
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
