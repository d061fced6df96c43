"""The index kernels on both slot layouts (wide 16-byte slots, the host's 12-byte pairs) and
on any number of slots (fastrange homes where it is not a power of two): the cpu kernels
against the numpy reference on random inputs, slot for slot after inserts (one layout, so an
index built by one backend is read by the other), and the fused readers that probe through
``probe_range`` (gather, bag combine, half-precision gather) reading a pairs index."""

from __future__ import annotations

import numpy as np
import pytest

from evdb.kernels import backend
from evdb.kernels.cpu.index import _home_of
from evdb.kernels.reference.index import home_slots, n_slots, slot_keys, slot_rows

cpu, ref = backend("cpu"), backend("reference")

# (layout, slots): powers of two and not, tiny ones (long runs that wrap) and larger
SHAPES = [("wide", 64), ("wide", 1000), ("pairs", 16), ("pairs", 1024), ("pairs", 3000)]


def _empty(layout: str, cap: int) -> np.ndarray:
    if layout == "pairs":
        return np.zeros((cap // 2, 3), np.int64)
    slots = np.zeros((cap, 2), np.int64)
    slots[:, 1] = -1
    return slots


def _keys(rng: np.random.Generator, n: int) -> np.ndarray:
    keys = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)
    keys[: min(n, 3)] = [0, -1, 2**63 - 1][: min(n, 3)]  # the edges are keys like any other
    return np.unique(keys)


@pytest.mark.parametrize(("layout", "cap"), SHAPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_insert_find_remove_equal_the_reference(layout: str, cap: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = _empty(layout, cap)
    b = a.copy()
    assert n_slots(a) == cap
    keys = _keys(rng, int(cap * 0.85))  # a high load: runs long enough to wrap around
    rows = rng.permutation(2 * keys.shape[0])[: keys.shape[0]].astype(np.int64)
    cpu.hash_insert(a, keys, rows)
    ref.hash_insert(b, keys, rows)
    np.testing.assert_array_equal(a, b)  # the same slots, not only the same answers
    absent = rng.integers(0, 2**62, 40)
    probe = np.concatenate([keys, absent[~np.isin(absent, keys)]])
    want = np.full(probe.shape[0], -1, np.int64)
    want[: keys.shape[0]] = rows
    for k in (cpu, ref):
        got = np.empty(probe.shape[0], np.int64)
        k.hash_find(a, probe, got)
        np.testing.assert_array_equal(got, want)
    gone = np.concatenate([rng.choice(keys, keys.shape[0] // 2, replace=False), absent[:3]])
    out_a, out_b = np.empty(gone.shape[0], np.int64), np.empty(gone.shape[0], np.int64)
    cpu.hash_remove(a, gone, out_a)
    ref.hash_remove(b, gone, out_b)
    np.testing.assert_array_equal(out_a, out_b)
    left = ~np.isin(probe, gone)
    want[~left] = -1
    for slots in (a, b):
        got = np.empty(probe.shape[0], np.int64)
        cpu.hash_find(slots, probe, got)
        np.testing.assert_array_equal(got, want)
    assert np.count_nonzero(slot_rows(a) >= 0) == np.count_nonzero(left[: keys.shape[0]])


def test_the_pairs_layout_keeps_each_slots_key_and_row_where_it_says() -> None:
    slots = np.zeros((4, 3), np.int64)  # 8 slots, a power of two: home = mix64 & 7
    key = np.int64(-5)
    home = int(home_slots(np.array([key]), 8)[0])
    cpu.hash_insert(slots, np.array([key]), np.array([2**32 - 2], np.int64))
    p, lane = divmod(home, 2)
    assert slots[p, lane] == key
    assert (int(slots[p, 2]) >> (32 * lane)) & 0xFFFFFFFF == 2**32 - 1  # row + 1
    assert np.count_nonzero(slots) == 2  # the rest of a zeroed table stays empty
    assert slot_keys(slots)[home] == key and slot_rows(slots)[home] == 2**32 - 2


@pytest.mark.parametrize("cap", [8, 1000, 2**32, 2**32 + 6, 3 * 2**33])
def test_home_slots_equal_the_reference_for_any_size(cap: int) -> None:
    keys = _keys(np.random.default_rng(cap % 1000), 200)
    want = home_slots(keys, cap)
    assert ((want >= 0) & (want < cap)).all()
    got = [_home_of(k, cap) for k in keys.tolist()]
    np.testing.assert_array_equal(got, want)
    if cap & (cap - 1):  # fastrange spreads keys over the whole range, not only its start
        assert want.max() > cap // 2


def _stored(rng: np.random.Generator, n: int, cap: int) -> tuple[np.ndarray, np.ndarray]:
    keys = _keys(rng, n)
    slots = _empty("pairs", cap)
    cpu.hash_insert(slots, keys, np.arange(keys.shape[0], dtype=np.int64))
    return keys, slots


@pytest.mark.parametrize("n_probe", [5, 3000])  # serial and parallel
def test_probe_gather_reads_a_pairs_index_as_the_reference_does(n_probe: int) -> None:
    rng = np.random.default_rng(n_probe)
    keys, slots = _stored(rng, 500, 1002)
    dim = 7
    values = rng.standard_normal((keys.shape[0], dim)).astype(np.float32)
    last_step = rng.integers(0, 10, keys.shape[0]).astype(np.int64)
    pool = np.concatenate([keys, rng.integers(0, 2**62, 200)])
    probe = pool[rng.integers(0, pool.shape[0], n_probe)]
    results = []
    for k in (cpu, ref):
        out = np.full((n_probe, dim), 7.0, np.float32)
        out_rows = np.empty(n_probe, np.int64)
        missing = k.probe_gather(slots, values, last_step, probe, 5, out, out_rows)
        results.append((missing, out, out_rows))
    assert results[0][0] == results[1][0] > 0
    np.testing.assert_array_equal(results[0][1], results[1][1])
    np.testing.assert_array_equal(results[0][2], results[1][2])


@pytest.mark.parametrize("combiner", [0, 1, 2])
def test_probe_gather_combine_reads_a_pairs_index_as_the_reference_does(combiner: int) -> None:
    rng = np.random.default_rng(combiner)
    keys, slots = _stored(rng, 400, 1000)
    dim = 9
    values = rng.standard_normal((keys.shape[0], dim)).astype(np.float32)
    last_step = rng.integers(0, 10, keys.shape[0]).astype(np.int64)
    sizes = rng.integers(0, 6, 50)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    pool = np.concatenate([keys, rng.integers(0, 2**62, 100)])
    probe = pool[rng.integers(0, pool.shape[0], int(bounds[-1]))]
    weights = rng.random(probe.shape[0]).astype(np.float32)
    outs = []
    for k in (cpu, ref):
        out = np.full((sizes.shape[0], dim), np.nan, np.float32)
        missing = k.probe_gather_combine(
            slots, values, last_step, probe, bounds, weights, 4, combiner, 0.0, 0,
            np.uint64(3), -0.25, 0.5, out,
        )  # fmt: skip
        outs.append((missing, out))
    assert outs[0][0] == outs[1][0] > 0
    np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-6)


def test_the_half_precision_gather_reads_a_pairs_index_as_the_reference_does() -> None:
    rng = np.random.default_rng(9)
    keys, slots = _stored(rng, 300, 600)
    dim = 5
    values = rng.integers(0, 2**15, (keys.shape[0], dim)).astype(np.uint16)
    last_step = rng.integers(0, 10, keys.shape[0]).astype(np.int64)
    pool = np.concatenate([keys, rng.integers(0, 2**62, 100)])
    probe = pool[rng.integers(0, pool.shape[0], 2000)]
    outs = []
    for k in (cpu, ref):
        out = np.full((probe.shape[0], dim), 7.0, np.float32)
        out_rows = np.empty(probe.shape[0], np.int64)
        missing = k.probe_gather_widened(slots, values, last_step, probe, 5, out, out_rows)
        outs.append((missing, out.view(np.uint32), out_rows))
    assert outs[0][0] == outs[1][0] > 0
    for x, y in zip(outs[0][1:], outs[1][1:], strict=True):
        np.testing.assert_array_equal(x, y)
