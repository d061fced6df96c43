"""The frozen-table kernels of quantised serving (``reference.frozen``, ``cpu.frozen``): the
reference finds exactly the keys a dict finds, and the numba kernels equal the reference
bit for bit on random tables and queries (serial and parallel sizes, under one numba thread
and all, int8 and int4, odd dims, empty tables, bags with weights, clipping, empty bags and
absent keys), and every finite float16 as a row's scale and bias dequantises as the
reference's."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from evdb.kernels.cpu import frozen as cpu_frozen
from evdb.kernels.reference import frozen as ref_frozen
from evdb.kernels.reference.lowp import quantize_rows, quantized_row_bytes

INIT = (2, 99, 0.0, 0.3)  # defaults: normal(0, 0.3), seed 99


@pytest.fixture(params=["one thread", "all threads"])
def numba_threads(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Run under one numba thread (the kernels then take the serial loop at every size) and
    under all of them (the prange kernels from PARALLEL_MIN_KEYS keys)."""
    before = numba.get_num_threads()
    numba.set_num_threads(1 if request.param == "one thread" else numba.config.NUMBA_NUM_THREADS)
    yield
    numba.set_num_threads(before)


def frozen_table(  # type: ignore[no-untyped-def]
    rng: np.random.Generator, n: int, dim: int, bits: int, n_buckets: int | None = None
):
    keys = rng.choice(2**40, n, replace=False).astype(np.int64) - 2**39
    values = (rng.normal(size=(n, dim)) * rng.uniform(0.01, 10, (n, 1))).astype(np.float32)
    q = np.zeros((n, quantized_row_bytes(dim, bits)), np.uint8)
    quantize_rows(values, bits, q)
    buckets = ref_frozen.bucket_count(n) if n_buckets is None else n_buckets
    order, directory = ref_frozen.frozen_order(keys, buckets)
    return directory, keys[order], np.ascontiguousarray(q[order])


def queries(rng: np.random.Generator, table_keys: np.ndarray, m: int) -> np.ndarray:
    absent = rng.integers(-(2**62), 2**62, m // 3)
    present = (
        table_keys[rng.integers(0, table_keys.shape[0], m - m // 3)]
        if table_keys.size
        else absent[:0]
    )
    out = np.concatenate([present, absent, [np.iinfo(np.int64).min, np.iinfo(np.int64).max]])
    rng.shuffle(out)
    return out.astype(np.int64)


@pytest.mark.parametrize("n", [0, 1, 9, 3000])
def test_the_reference_finds_what_a_dict_finds(rng, n: int) -> None:
    directory, tk, _ = frozen_table(rng, n, 2, 8)
    assert directory.shape[0] - 1 == ref_frozen.bucket_count(n)
    assert directory[0] == 0 and directory[-1] == n and (np.diff(directory) >= 0).all()
    asked = queries(rng, tk, 500)
    rows = np.empty(asked.shape[0], np.int64)
    missing = ref_frozen.search_rows(directory, tk, asked, rows)
    where = {int(k): i for i, k in enumerate(tk)}
    assert rows.tolist() == [where.get(int(k), -1) for k in asked]
    assert missing == sum(int(k) not in where for k in asked)


@pytest.mark.parametrize("bits,dim", [(8, 16), (8, 5), (4, 64), (4, 7)])
@pytest.mark.parametrize("n,m", [(0, 10), (50, 40), (5000, 3000)])  # 3000 keys: parallel
def test_search_gather_equals_the_reference(
    rng, numba_threads, bits: int, dim: int, n: int, m: int
) -> None:
    directory, tk, q = frozen_table(rng, n, dim, bits)
    asked = queries(rng, tk, m)
    out = [np.full((asked.shape[0], dim), 7.0, np.float32) for _ in range(2)]
    rows = [np.empty(asked.shape[0], np.int64) for _ in range(2)]
    want = ref_frozen.search_gather_dequantized(directory, tk, q, bits, asked, out[0], rows[0])
    got = cpu_frozen.search_gather_dequantized(directory, tk, q, bits, asked, out[1], rows[1])
    assert got == want
    np.testing.assert_array_equal(rows[1], rows[0])
    np.testing.assert_array_equal(out[1].view(np.uint32), out[0].view(np.uint32))
    assert (out[1][rows[1] < 0] == 7.0).all()  # untouched where not found


@pytest.mark.parametrize("n_buckets", [2, 64, 1024, 8192])  # 1000 to 0.25 rows a bucket
def test_any_directory_a_header_names_is_searched_as_the_reference(
    rng, numba_threads, n_buckets: int
) -> None:
    # a snapshot written with another ROWS_PER_BUCKET (8 before this one) opens as it was
    directory, tk, q = frozen_table(rng, 2000, 5, 8, n_buckets)
    assert directory.shape[0] - 1 == n_buckets
    asked = queries(rng, tk, 3000)
    out = [np.zeros((asked.shape[0], 5), np.float32) for _ in range(2)]
    rows = [np.empty(asked.shape[0], np.int64) for _ in range(2)]
    want = ref_frozen.search_gather_dequantized(directory, tk, q, 8, asked, out[0], rows[0])
    got = cpu_frozen.search_gather_dequantized(directory, tk, q, 8, asked, out[1], rows[1])
    assert got == want == asked.shape[0] - int(np.isin(asked, tk).sum())
    np.testing.assert_array_equal(rows[1], rows[0])
    np.testing.assert_array_equal(out[1].view(np.uint32), out[0].view(np.uint32))


@pytest.mark.parametrize("combiner", [0, 1, 2])  # sum, mean, sqrtn
@pytest.mark.parametrize("n_bags", [7, 1500])  # 1500 bags: parallel
@pytest.mark.parametrize("bits,dim", [(4, 12), (4, 7), (8, 5)])
def test_bags_equal_the_reference(
    rng, numba_threads, combiner: int, n_bags: int, bits: int, dim: int
) -> None:
    directory, tk, q = frozen_table(rng, 2000, dim, bits)
    sizes = rng.integers(0, 6, n_bags)
    sizes[0] = 0  # an empty bag gives zeros
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    asked = queries(rng, tk, int(bounds[-1]))[: bounds[-1]]
    weights = rng.uniform(-1, 2, asked.shape[0]).astype(np.float32)
    for max_norm in (np.inf, 0.7):
        out = [np.full((n_bags, dim), 3.0, np.float32) for _ in range(2)]
        args = (directory, tk, q, bits, asked, bounds, weights, combiner, max_norm, *INIT)
        want = ref_frozen.search_gather_combine_dequantized(*args, out[0])
        got = cpu_frozen.search_gather_combine_dequantized(*args, out[1])
        assert got == want
        # float32 sums in another order: errors of float32's epsilon times the terms' size
        terms = float(np.abs(out[0]).max()) + 1.0
        np.testing.assert_allclose(out[1], out[0], rtol=2e-5, atol=2e-6 * terms)
        assert (out[1][0] == 0).all()


@pytest.mark.parametrize("bits,dim", [(8, 3), (4, 3)])
def test_every_finite_float16_scale_and_bias_dequantises_as_the_reference(
    rng, bits: int, dim: int
) -> None:
    # The kernels read a row's fp16 scale and bias in integer operations: every finite
    # pattern (subnormals, both zeros, negatives, the largest) is a row's scale once and
    # another row's bias, with random codes, and must dequantise to the reference's bits.
    halves = np.arange(1 << 16, dtype=np.uint16)
    finite = halves[(halves & 0x7C00) != 0x7C00]
    n = finite.shape[0]
    q = rng.integers(0, 256, (n, quantized_row_bytes(dim, bits))).astype(np.uint8)
    q[:, 0:2] = finite.view(np.uint8).reshape(n, 2)
    q[:, 2:4] = rng.permutation(finite).view(np.uint8).reshape(n, 2)
    keys = np.arange(n, dtype=np.int64) * 7919 - 10**9
    order, directory = ref_frozen.frozen_order(keys, ref_frozen.bucket_count(n))
    tk, q = keys[order], np.ascontiguousarray(q[order])
    out = [np.empty((n, dim), np.float32) for _ in range(2)]
    rows = [np.empty(n, np.int64) for _ in range(2)]
    assert ref_frozen.search_gather_dequantized(directory, tk, q, bits, tk, out[0], rows[0]) == 0
    assert cpu_frozen.search_gather_dequantized(directory, tk, q, bits, tk, out[1], rows[1]) == 0
    np.testing.assert_array_equal(out[1].view(np.uint32), out[0].view(np.uint32))
