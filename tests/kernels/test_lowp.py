"""Half-precision rows and quantised rows: the properties the parity table cannot show.

Parity with the reference is in ``cases.py`` (round/widen, quantise/dequantise, the serving
gathers, the fused half-precision update). Here, on every host backend: stochastic rounding
is unbiased where round-to-nearest is not, reproducible from (seed, key, step, column) alone,
and what makes tiny updates add up; quantised round trips stay within half a step; the byte
layout is FBGEMM's; bad dtypes, bits and kinds are refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest

from evdb.errors import ConfigError, InvalidArgumentError, InvalidTypeError
from evdb.kernels import BACKENDS, OptimizerKind, backend
from evdb.kernels.reference.lowp import quantized_row_bytes, storage_dtype, widen

HALF = {"bfloat16": np.uint16, "float16": np.float16}
MANTISSA_BITS = {"bfloat16": 7, "float16": 10}
# Mean rounding error allowed, in ulps. Stochastic rounding of N = 4096 draws has a standard
# error of at most 0.5 / sqrt(N) = 0.008 ulp, so 0.05 is 6 standard errors; round-to-nearest
# errs by the whole fraction, at least 0.2 ulp for the values drawn below.
BIAS_BOUND = 0.05
N_DRAWS = 4096


@pytest.fixture(params=BACKENDS)
def k(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    return backend(request.param)


def ulp(x: np.ndarray, fmt: str) -> np.ndarray:
    """The half-precision ulp at x (normal range)."""
    return np.exp2(np.floor(np.log2(np.abs(x))) - MANTISSA_BITS[fmt])


def between_halves(rng: np.random.Generator, m: int, fmt: str) -> np.ndarray:
    """m float32 values whose fraction of a half-precision ulp is in [0.2, 0.8]."""
    base = rng.uniform(0.5, 4.0, m) * rng.choice([-1, 1], m)
    step = ulp(base, fmt)
    lower = np.trunc(base / step) * step
    return (lower + np.sign(base) * rng.uniform(0.2, 0.8, m) * step).astype(np.float32)


def round_many(k, x: np.ndarray, fmt: str, stochastic: bool, *, step: int = 0) -> np.ndarray:  # type: ignore[no-untyped-def]
    """(N_DRAWS, m): x rounded once for each of N_DRAWS keys."""
    values = np.tile(x.astype(np.float32), (N_DRAWS, 1))
    rows = np.arange(N_DRAWS, dtype=np.int64)
    keys = np.arange(N_DRAWS, dtype=np.int64) * 7919 - 10**6
    out = np.zeros(values.shape, HALF[fmt])
    k.round_rows(values, rows, keys, 42, step, stochastic, out)
    return widen(out).astype(np.float64)


@pytest.mark.parametrize("fmt", sorted(HALF))
def test_stochastic_rounding_is_unbiased_and_nearest_is_not(k, rng, fmt: str) -> None:
    x = between_halves(rng, 16, fmt)
    step = ulp(x, fmt)
    sr = (round_many(k, x, fmt, True) - x).mean(axis=0) / step
    rn = (round_many(k, x, fmt, False) - x).mean(axis=0) / step
    assert np.abs(sr).max() < BIAS_BOUND, sr
    assert (np.abs(rn) > BIAS_BOUND).all(), rn  # the same bound fails round-to-nearest


@pytest.mark.parametrize("fmt", sorted(HALF))
def test_stochastic_rounding_is_unbiased_over_the_steps_of_one_key(k, rng, fmt: str) -> None:
    # One key, one row, rounded again at every step: the step alone must refresh the bits.
    x = between_halves(rng, 16, fmt)[None, :]
    draws = np.zeros((2048, 16), HALF[fmt])
    rows, keys = np.zeros(1, np.int64), np.full(1, 99, np.int64)
    for s in range(draws.shape[0]):
        k.round_rows(x, rows, keys, 5, s, True, draws[s : s + 1])
    err = (widen(draws).astype(np.float64) - x).mean(axis=0) / ulp(x[0], fmt)
    assert np.abs(err).max() < BIAS_BOUND, err  # 2048 draws: standard error <= 0.011 ulp


@pytest.mark.parametrize("fmt", sorted(HALF))
def test_rounding_bits_are_a_function_of_seed_key_step_and_column(k, rng, fmt: str) -> None:
    x = np.tile(between_halves(rng, 32, fmt), (200, 1))
    keys = rng.integers(-(2**63), 2**63 - 1, 200, dtype=np.int64)
    rows = np.arange(200, dtype=np.int64)

    def stored(seed: int, step: int, order: np.ndarray) -> np.ndarray:
        out = np.zeros((200, 32), HALF[fmt])
        k.round_rows(x[order], rows[order], keys[order], seed, step, True, out)
        return out.view(np.uint16)

    ident, shuffled = np.arange(200), rng.permutation(200)
    first = stored(1, 10, ident)
    np.testing.assert_array_equal(first, stored(1, 10, ident))  # deterministic
    np.testing.assert_array_equal(first, stored(1, 10, shuffled))  # whatever the batch order
    assert (first != stored(2, 10, ident)).mean() > 0.3  # another seed draws other bits
    assert (first != stored(1, 11, ident)).mean() > 0.3  # so does another step
    for c in range(5):  # and another column (same value there), in a group of four or not
        assert (first[:, c] != first[:, c + 1]).mean() > 0.3, c


@pytest.mark.parametrize("fmt", sorted(HALF))
def test_a_columns_bits_do_not_depend_on_the_rows_width(k, rng, fmt: str) -> None:
    # Column c draws the same bits in a row of any width: the half optimizer slots are
    # columns dim.. of one record with the row, and a row's rounding must not change with them.
    wide = np.tile(between_halves(rng, 11, fmt), (300, 1))
    keys = rng.integers(-(2**63), 2**63 - 1, 300, dtype=np.int64)
    rows = np.arange(300, dtype=np.int64)
    stored = {}
    for width in (5, 11):
        out = np.zeros((300, width), HALF[fmt])
        k.round_rows(np.ascontiguousarray(wide[:, :width]), rows, keys, 3, 8, True, out)
        stored[width] = out.view(np.uint16)
    np.testing.assert_array_equal(stored[5], stored[11][:, :5])


def test_float16_subnormals_round_unbiased_to_within_the_bound(k, rng) -> None:
    # Below 2^-14 float16 cuts off more than the 16 random bits resolve: P(up) is the
    # fraction rounded up to a multiple of 2^-16, still far inside the bound, and nearest
    # still fails it.
    tiny_ulp = 2.0**-24
    x = ((rng.integers(1, 1000, 16) + rng.uniform(0.2, 0.8, 16)) * tiny_ulp).astype(np.float32)
    x *= rng.choice(np.array([-1, 1], np.float32), 16)
    sr = (round_many(k, x, "float16", True) - x).mean(axis=0) / tiny_ulp
    rn = (round_many(k, x, "float16", False) - x).mean(axis=0) / tiny_ulp
    assert np.abs(sr).max() < BIAS_BOUND, sr
    assert (np.abs(rn) > BIAS_BOUND).all(), rn


def test_round_to_nearest_is_numpy_float16_and_torch_bfloat16(k, rng) -> None:
    x = rng.integers(0, 2**32, (400, 64), dtype=np.uint64).astype(np.uint32).view(np.float32)
    rows, keys = np.arange(400, dtype=np.int64), np.zeros(400, np.int64)
    half = np.zeros(x.shape, np.float16)
    k.round_rows(x, rows, keys, 0, 0, False, half)
    with np.errstate(over="ignore", invalid="ignore"):
        np.testing.assert_array_equal(half.view(np.uint16), x.astype(np.float16).view(np.uint16))
    torch = pytest.importorskip("torch")
    bf = np.zeros(x.shape, np.uint16)
    k.round_rows(x, rows, keys, 0, 0, False, bf)
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    finite = np.isfinite(x)  # torch writes every NaN as 0xFFFF; evdb keeps its top bits
    np.testing.assert_array_equal(bf[finite], want[finite])
    assert np.isnan(widen(bf)[~finite & np.isnan(x)]).all()


@pytest.mark.parametrize("fmt", sorted(HALF))
@pytest.mark.parametrize("kind", [OptimizerKind.SGD, OptimizerKind.ROWWISE_ADAGRAD])
def test_stochastic_rounding_lets_tiny_updates_add_up(k, fmt: str, kind: int) -> None:
    # Every step moves each weight by a tenth of an ulp: rounding to nearest keeps the rows
    # where they started, stochastic rounding follows the float64 trajectory on average.
    n, dim, steps = 512, 8, 40
    w0 = np.float32(1.5)
    values = {sr: np.full((n, dim), w0).astype(np.float32) for sr in (False, True)}
    stored = {}
    for sr, v in values.items():
        out = np.zeros((n, dim), HALF[fmt])
        k.round_rows(v, np.arange(n, dtype=np.int64), np.zeros(n, np.int64), 0, 0, False, out)
        stored[sr] = out
    one_ulp = float(ulp(np.array([w0]), fmt)[0])
    lr = 0.1 * one_ulp
    grads = np.ones((n, dim), np.float32)  # row-wise Adagrad: g / sqrt(acc) ~ 1 with acc = 1
    hyper = np.array([lr, 0.0, 0.0, 0.0])  # no weight decay, lasso or eps
    keys = np.arange(n, dtype=np.int64) + 10
    pos = np.arange(n, dtype=np.int64)
    bounds = np.arange(n + 1, dtype=np.int64)
    for sr in (False, True):
        slots = np.zeros((n, 1), np.float32)
        for s in range(steps):
            slots[:] = 1.0 - (1.0 if kind == OptimizerKind.ROWWISE_ADAGRAD else 0.0)
            k.segment_sum_apply_lowp(
                grads, pos, bounds, pos, keys, kind, hyper, 3, s, sr, stored[sr], slots
            )
    drift = steps * lr
    got_rn = widen(stored[False]).astype(np.float64).mean()
    got_sr = widen(stored[True]).astype(np.float64).mean()
    assert got_rn == w0  # every update was lost
    assert abs((w0 - got_sr) - drift) < 0.1 * drift  # within 10% of the true drift


def test_half_update_refuses_a_kind_without_a_half_variant(k) -> None:
    values = np.zeros((2, 3), np.uint16)
    slots = np.zeros((2, 6), np.float32)
    args = (np.zeros((1, 3), np.float32), np.zeros(1, np.int64), np.array([0, 1]))
    with pytest.raises(InvalidArgumentError, match=r"kind: .*expected one of \(0, 1, 2, 6\)"):
        k.segment_sum_apply_lowp(
            *args, np.zeros(1, np.int64), np.zeros(2, np.int64), OptimizerKind.FTRL,
            np.zeros(8), 0, 0, True, values, slots,
        )  # fmt: skip
    assert not values.any() and not slots.any()


def test_widening_every_float16_and_bfloat16_pattern_is_exact(k) -> None:
    # All 65,536 bit patterns: subnormals, both zeros, infinities and NaN payloads included
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    rows = np.arange(256, dtype=np.int64)
    out = np.zeros((256, 256), np.float32)
    k.widen_rows(every.view(np.float16), rows, out)
    want = every.view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
    k.widen_rows(every, rows, out)
    np.testing.assert_array_equal(out.view(np.uint32), every.astype(np.uint32) << 16)


def _update_case(
    rng: np.random.Generator, fmt: str, n: int, dim: int, kind: int
) -> tuple[np.ndarray, ...]:
    """(grads, positions, bounds, rows, row_keys, hyper, start, slots): n rows of awkward values
    (float16 subnormals, values near float16's overflow, ties), one position a row, so every
    backend sums nothing and computes the same float64 rule."""
    from tests.kernels.cases import HYPER, SLOTS, awkward_floats

    x = awkward_floats(rng, (n, dim))
    x[~np.isfinite(x)] = 1.0
    x = np.clip(x, -60000, 60000).astype(np.float32)
    x[: n // 4] *= np.float32(2.0**-20)  # in and around float16's subnormal range
    start = np.zeros((n, dim), HALF[fmt])
    rows = np.arange(n, dtype=np.int64)
    backend("reference").round_rows(x, rows, rows, 0, 0, False, start)
    grads = (rng.standard_normal((n, dim)) * np.exp2(rng.integers(-24, 4, (n, 1)))).astype(
        np.float32
    )
    n_slots = 1 if SLOTS[kind] == -1 else SLOTS[kind] * dim
    slots = rng.uniform(0.1, 1.0, (n, n_slots)).astype(np.float32)
    hyper = np.array(HYPER[kind] + [0.0] * (8 - len(HYPER[kind])))
    keys = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    positions = rng.permutation(n).astype(np.int64)
    bounds = np.arange(n + 1, dtype=np.int64)
    return grads, positions, bounds, rng.permutation(n).astype(np.int64), keys, hyper, start, slots


@pytest.mark.parametrize("fmt", sorted(HALF))
@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("kind", [0, 1, 2, 6])
@pytest.mark.parametrize("n", [40, 3000])  # the serial and the parallel driver
def test_half_update_of_awkward_rows_is_the_reference_bit_for_bit(
    rng, fmt: str, stochastic: bool, kind: int, n: int
) -> None:
    # The parity table's update sums several positions a row, which may differ in the last
    # bit between backends; with one position a row nothing may differ, down to float16's
    # subnormals, which the cpu kernel rounds outside its vectorised loop.
    grads, positions, bounds, rows, keys, hyper, start, slots = _update_case(rng, fmt, n, 9, kind)
    got = {}
    for name in BACKENDS:
        values, s = start.copy(), slots.copy()
        backend(name).segment_sum_apply_lowp(
            grads, positions, bounds, rows, keys, kind, hyper, 5, 7, stochastic, values, s
        )
        got[name] = (values.view(np.uint16), s)
    want = got["reference"]
    assert (want[0] != start.view(np.uint16)).mean() > 0.5  # the rows moved
    for name in BACKENDS:
        np.testing.assert_array_equal(got[name][0], want[0])
        np.testing.assert_array_equal(got[name][1], want[1])


@pytest.mark.parametrize("fmt", sorted(HALF))
@pytest.mark.parametrize("kind", [0, 1, 2, 6])
def test_half_update_is_the_float32_update_rounded(k, rng, fmt: str, kind: int) -> None:
    # One rule per optimizer for both kernels: updating float32 rows that hold the widened
    # half rows, then rounding to nearest, is the half update with round-to-nearest, and the
    # slots are the same, bit for bit.
    grads, positions, bounds, rows, keys, hyper, start, slots = _update_case(rng, fmt, 200, 7, kind)
    half, half_slots = start.copy(), slots.copy()
    k.segment_sum_apply_lowp(
        grads, positions, bounds, rows, keys, kind, hyper, 5, 7, False, half, half_slots
    )
    full, full_slots = widen(start), slots.copy()
    k.segment_sum_apply(grads, positions, bounds, rows, kind, hyper, full, full_slots)
    rounded = np.zeros_like(start)
    every = np.arange(full.shape[0], dtype=np.int64)
    k.round_rows(full, every, every, 0, 0, False, rounded)
    np.testing.assert_array_equal(half.view(np.uint16), rounded.view(np.uint16))
    np.testing.assert_array_equal(half_slots, full_slots)


@pytest.mark.parametrize("fmt", sorted(HALF))
@pytest.mark.parametrize("n", [40, 3000])  # the serial and the parallel driver
def test_half_update_rounds_each_row_with_the_key_stored_at_it(k, rng, fmt: str, n: int) -> None:
    # row_keys is the tier's key column: a row's random bits come from row_keys[row], not from
    # its place in the batch. The batch reversed stores the same bits; a new key at one
    # updated row changes that row only; a key at a row the batch leaves alone changes nothing.
    grads, positions, bounds, rows, row_keys, hyper, start, slots = _update_case(
        rng, fmt, n, 9, OptimizerKind.ROWWISE_ADAGRAD
    )

    def update(rows: np.ndarray, positions: np.ndarray, row_keys: np.ndarray) -> np.ndarray:
        values = start.copy()
        k.segment_sum_apply_lowp(
            grads, positions, bounds, rows, row_keys, OptimizerKind.ROWWISE_ADAGRAD, hyper,
            5, 7, True, values, slots.copy(),
        )  # fmt: skip
        return values.view(np.uint16)

    # the batch leaves the last row alone (one position a row: bounds[u] = u)
    rows, positions, bounds = rows[:-1], positions[:-1], bounds[:-1]
    want = update(rows, positions, row_keys)
    assert (want != start.view(np.uint16)).mean() > 0.5  # the rows moved
    backwards = (np.ascontiguousarray(rows[::-1]), np.ascontiguousarray(positions[::-1]))
    np.testing.assert_array_equal(update(*backwards, row_keys), want)
    other = row_keys.copy()
    other[rows[0]] ^= 0x5A5A5A5A5A5A5A5A
    got = update(rows, positions, other)
    assert (got[rows[0]] != want[rows[0]]).any()
    got[rows[0]] = want[rows[0]]
    np.testing.assert_array_equal(got, want)
    left_alone = np.setdiff1d(np.arange(n), rows)[0]
    other = row_keys.copy()
    other[left_alone] ^= 0x5A5A5A5A5A5A5A5A
    np.testing.assert_array_equal(update(rows, positions, other), want)


def test_half_update_refuses_row_keys_that_are_not_a_key_a_row(k) -> None:
    # The kernels read row_keys[rows[u]] unchecked: one key for each of values' rows, or none
    values = np.zeros((4, 3), np.uint16)
    slots = np.zeros((4, 1), np.float32)
    args = (np.ones((1, 3), np.float32), np.zeros(1, np.int64), np.array([0, 1]))
    for row_keys in (np.zeros(3, np.int64), np.zeros((4, 1), np.int64)):
        with pytest.raises(InvalidArgumentError, match=r"row_keys: expected the key of each of"):
            k.segment_sum_apply_lowp(
                *args, np.array([3]), row_keys, OptimizerKind.ROWWISE_ADAGRAD, np.ones(8), 0, 0,
                True, values, slots,
            )  # fmt: skip
        assert not values.any() and not slots.any()
    # a tier with no row yet: every row -1 (kept out by admission), no key to read
    none = (np.zeros((0, 3), np.uint16), np.zeros((0, 1), np.float32))
    k.segment_sum_apply_lowp(
        *args, np.array([-1]), np.zeros(0, np.int64), OptimizerKind.ROWWISE_ADAGRAD, np.ones(8),
        0, 0, True, *none,
    )  # fmt: skip


@pytest.mark.parametrize("fmt", sorted(HALF))
@pytest.mark.parametrize("n", [50, 5000])  # the serial and the parallel driver
def test_a_pulls_stamp_and_widen_pass_is_its_reference(rng, fmt: str, n: int) -> None:
    from evdb.kernels.cpu.lowp_gather import stamp_widen_pulled as cpu_pass
    from evdb.kernels.reference.lowp import stamp_widen_pulled as reference_pass
    from evdb.records import FREQ_MAX
    from tests.kernels.cases import batch_rows

    n_rows, dim = n + 20, 37
    half = rng.integers(0, 2**16, (n_rows, dim)).astype(np.uint16).view(HALF[fmt])
    rows = batch_rows(rng, n_rows, n)
    counts = rng.integers(1, 5, n).astype(np.int64)
    freq = rng.integers(0, int(FREQ_MAX) + 1, n_rows, dtype=np.int64).astype(np.uint32)
    freq[:5] = FREQ_MAX - 1  # saturates
    columns = (
        freq,
        rng.integers(0, 9, n_rows).astype(np.int64),  # last_step
        rng.integers(0, 9, n_rows).astype(np.uint64),  # versions
        rng.random(n_rows) < 0.5,  # is_dirty
        rng.random(n_rows) < 0.5,  # is_pinned
    )
    got = {}
    for name, run in (("cpu", cpu_pass), ("reference", reference_pass)):
        cols = tuple(c.copy() for c in columns)
        out = np.full((n, dim), 7.0, np.float32)
        stamped = run(rows, counts, 11, 12, int(FREQ_MAX), *cols, half, out)
        got[name] = (stamped, out.view(np.uint32), *cols)
    assert got["cpu"][0] == np.count_nonzero(rows >= 0)
    assert (got["cpu"][1][rows < 0] == np.float32(7.0).view(np.uint32)).all()
    for a, b in zip(got["cpu"], got["reference"], strict=True):
        np.testing.assert_array_equal(a, b)


# -- quantised rows -----------------------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dim", [1, 5, 64])
def test_quantised_round_trip_is_within_half_a_step(k, rng, bits: int, dim: int) -> None:
    n = 500
    values = (rng.standard_normal((n, dim)) * np.exp2(rng.integers(-12, 12, (n, 1)))).astype(
        np.float32
    )
    values += rng.uniform(-100, 100, (n, 1)).astype(np.float32) * (rng.random((n, 1)) < 0.3)
    q = np.zeros((n, quantized_row_bytes(dim, bits)), np.uint8)
    k.quantize_rows(values, bits, q)
    out = np.empty((n, dim), np.float32)
    k.dequantize_rows(q, bits, np.arange(n, dtype=np.int64), out)
    scale = q[:, 0:2].copy().view(np.float16).astype(np.float64)  # (n, 1)
    err = np.abs(out.astype(np.float64) - values)
    rounding = np.spacing(np.abs(values)).astype(np.float64)  # the float32 result's own ulp
    assert (err <= scale / 2 + rounding).all()
    # and the step is no coarser than the row needs: (max - bias) / levels, rounded up
    bias = q[:, 2:4].copy().view(np.float16).astype(np.float64)
    need = (values.max(axis=1, keepdims=True) - bias) / ((1 << bits) - 1)
    assert ((scale <= need * (1 + 2**-10) + 2**-24) | ((need == 0) & (scale == 1))).all()


def test_quantised_layout_is_fbgemm_rowwise(k) -> None:
    # int4, a row 0..15 then 7: bias 0, scale 1, codes = values, two a byte, low nibble first
    values = np.array([[*range(16), 7]], np.float32)
    q = np.full((1, quantized_row_bytes(17, 4, align=16)), 0xFF, np.uint8)
    assert q.shape[1] == 16  # 4 + ceil(17 / 2) = 13 bytes, padded to 16
    k.quantize_rows(values, 4, q)
    assert q[0, 0:2].view(np.float16)[0] == 1.0 and q[0, 2:4].view(np.float16)[0] == 0.0
    assert q[0, 4:13].tolist() == [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE, 0x07]
    assert q[0, 13:].tolist() == [0, 0, 0]  # padding is zero
    q8 = np.zeros((1, quantized_row_bytes(17, 8)), np.uint8)
    assert q8.shape[1] == 21  # D + 4
    k.quantize_rows(values, 8, q8)
    scale = np.float64(q8[0, 0:2].view(np.float16)[0])
    assert scale >= 15 / 255 and q8[0, 2:4].view(np.float16)[0] == 0.0
    assert q8[0, 4:].tolist() == np.rint(values[0] / scale).astype(int).tolist()


def test_quantise_refuses_bad_bits_and_bad_rows_and_writes_nothing(k) -> None:
    values = np.ones((3, 4), np.float32)
    q = np.full((3, 8), 7, np.uint8)
    with pytest.raises(InvalidArgumentError, match=r"bits: expected one of \(8, 4\)"):
        k.quantize_rows(values, 2, q)
    values[1, 2] = np.nan
    values[2, 0] = 1e6
    with pytest.raises(InvalidArgumentError, match="values: row 1 "):
        k.quantize_rows(values, 8, q)
    with pytest.raises(InvalidArgumentError, match="out: expected"):
        k.quantize_rows(np.ones((3, 9), np.float32), 8, q)
    assert (q == 7).all()


def test_bad_storage_dtypes_are_refused_naming_the_choices(k) -> None:
    with pytest.raises(ConfigError, match=r"dtype: expected one of \('float32', 'bfloat16', "):
        storage_dtype("float64")
    assert storage_dtype("bfloat16") == np.uint16 and storage_dtype("float16") == np.float16
    values = np.ones((2, 3), np.float32)
    rows = np.arange(2, dtype=np.int64)
    for bad in (np.float32, np.int16):
        out = np.zeros((2, 3), bad)
        with pytest.raises(InvalidTypeError, match=r"out: expected uint16 \(bfloat16 bits\) or"):
            k.round_rows(values, rows, rows, 0, 0, True, out)
        assert not out.any()
        with pytest.raises(InvalidTypeError, match=r"src: expected uint16 \(bfloat16 bits\) or"):
            k.widen_rows(out, rows, np.zeros((2, 3), np.float32))


LOWP_VARIANTS = [
    ("lowp", "round_rows"),
    ("lowp", "widen_rows"),
    ("quantize", "dequantize_rows"),
    ("lowp_gather", "probe_gather_lowp"),
    ("lowp_gather", "probe_gather_combine_lowp"),
    ("lowp_optim", "segment_sum_apply_lowp"),
    ("lowp_gather", "stamp_widen_pulled"),
]


@pytest.mark.parametrize("module,name", LOWP_VARIANTS)
def test_serial_and_parallel_variants_are_distinct_functions(module: str, name: str) -> None:
    # As tests/kernels/test_parity.py checks for the other kernels: numba's on-disk cache keys
    # entries by function name and first line, so two dispatchers over one function share one.
    import importlib

    mod = importlib.import_module(f"evdb.kernels.cpu.{module}")
    serial, parallel = getattr(mod, f"_{name}_serial"), getattr(mod, f"_{name}_parallel")
    a, b = serial.py_func.__code__, parallel.py_func.__code__
    assert (a.co_name, a.co_firstlineno) != (b.co_name, b.co_firstlineno)
    assert parallel.targetoptions.get("parallel") and not serial.targetoptions.get("parallel")


@pytest.mark.parametrize(
    "fmt,x,want",
    [
        ("bfloat16", 1 + 2**-8, 1.0),  # a tie: to the even neighbour, down
        ("bfloat16", 1 + 3 * 2**-8, 1 + 2**-6),  # a tie: to the even neighbour, up
        ("bfloat16", -(1 + 2**-7 + 2**-9), -(1 + 2**-7)),  # below half an ulp, magnitude down
        ("bfloat16", 2**-133, 2**-133),  # the smallest bfloat16 subnormal, exactly
        ("float16", 65519.99, 65504.0),  # the largest finite float16
        ("float16", 65520.0, np.inf),  # a tie past it: infinity, as IEEE rounds
        ("float16", 2**-25, 0.0),  # half the smallest subnormal: a tie, to zero (even)
        ("float16", 3 * 2**-25, 2**-23),  # a tie between 1 and 2 ulps: to 2
        ("float16", -(2**-14) * (1 - 2**-11), -(2**-14)),  # subnormal rounding up to normal
    ],
)
def test_round_to_nearest_by_hand(k, fmt: str, x: float, want: float) -> None:
    out = np.zeros((1, 1), HALF[fmt])
    one = np.zeros(1, np.int64)
    k.round_rows(np.array([[x]], np.float32), one, one, 0, 0, False, out)
    assert widen(out)[0, 0] == np.float32(want)
