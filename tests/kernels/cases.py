"""The parity table: every kernel in ``evdb.kernels.KERNELS``, as cases run on every backend.

A case is a function ``run(kernels, rng, **params)`` that draws its inputs from ``rng``, calls
one or more kernels of the backend module ``kernels`` and returns what must agree: the
kernels' return values and every array they wrote. ``tests/kernels/test_parity.py`` runs each
case on ``reference`` and on the backend under test with generators seeded alike (so both see
the same inputs; a case draws everything before its first kernel call) and compares the
results, exactly unless the case gives a tolerance. ``tests/gpu`` runs the same table on the
gpu backend. Assertions inside a case (say, that a probe met both hits and misses) hold for
every backend. ``test_every_kernel_has_a_case`` checks that the table covers ``KERNELS``.

Each case is registered by ``@case(<the kernels it calls>, <tolerance>, **grid)``, once per
combination of its grid's parameters.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evdb.records import FREQ_MAX, FROZEN

EDGE_KEYS = np.array([0, -1, 1, 2**63 - 1, -(2**63)], dtype=np.int64)
# Float kernels sum in a different order per backend (and numba's libm is not numpy's).
RTOL, ATOL = 2e-5, 2e-6
INF = float("inf")

Results = tuple[Any, ...]


@dataclass(frozen=True)
class Case:
    """One row of the table: ``run`` on a backend module and a generator -> results."""

    kernels: tuple[str, ...]
    id: str
    run: Callable[[Any, np.random.Generator], Results]
    rtol: float = 0.0
    atol: float = 0.0
    # Extra agreement beyond the tolerance: also(got, want) raises when it does not hold.
    also: Callable[[Results, Results], None] | None = field(default=None)

    def __str__(self) -> str:
        return self.id


CASES: list[Case] = []


def case(
    *kernels: str,
    rtol: float = 0.0,
    atol: float = 0.0,
    also: Callable[[Results, Results], None] | None = None,
    **grid: list[Any],
) -> Callable[[Callable[..., Results]], Callable[..., Results]]:
    """Register ``run`` once per combination of the ``grid`` parameters."""

    def register(run: Callable[..., Results]) -> Callable[..., Results]:
        for values in itertools.product(*grid.values()):
            params = dict(zip(grid, values, strict=True))
            label = ",".join(f"{k}={v}" for k, v in params.items())
            case_id = f"{run.__name__}[{label}]" if label else run.__name__
            bound = functools.partial(run, **params)
            CASES.append(Case(kernels, case_id, bound, rtol, atol, also))
        return run

    return register


def assert_same(got: Results, want: Results, rtol: float, atol: float) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if isinstance(w, np.ndarray):
            if rtol == atol == 0:
                np.testing.assert_array_equal(g, w, err_msg=f"result {i}")
            else:
                np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"result {i}")
        else:
            assert g == w, f"result {i}: {g!r} != {w!r}"


# -- inputs -------------------------------------------------------------------------------


def random_keys(rng: np.random.Generator, n: int, *, dup_from: int | None = None) -> np.ndarray:
    """n keys over the whole int64 range (with the edge values), or drawn from a small pool."""
    if dup_from is not None:
        pool = rng.integers(-(2**63), 2**63 - 1, dup_from, dtype=np.int64, endpoint=True)
        return np.concatenate([EDGE_KEYS, pool[rng.integers(0, dup_from, n)]])
    keys = np.unique(rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True))
    return rng.permutation(np.union1d(keys, EDGE_KEYS))


def empty_index(cap: int) -> np.ndarray:
    slots = np.zeros((cap, 2), dtype=np.int64)
    slots[:, 1] = -1
    return slots


def random_bags(rng: np.random.Generator, n_bags: int, max_len: int) -> np.ndarray:
    """bounds (B + 1,) with some empty bags."""
    lengths = rng.integers(0, max_len + 1, n_bags)
    lengths[rng.random(n_bags) < 0.15] = 0
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def weights_for(rng: np.random.Generator, bounds: np.ndarray, weighted: bool) -> np.ndarray:
    n = int(bounds[-1])
    if not weighted:
        return np.ones(n, np.float32)
    w = rng.uniform(-0.5, 2.0, n).astype(np.float32)
    if bounds.shape[0] > 3:  # one non-empty bag whose weights sum to zero
        b = int(np.flatnonzero(np.diff(bounds) >= 2)[0]) if (np.diff(bounds) >= 2).any() else -1
        if b >= 0:
            w[bounds[b] : bounds[b + 1]] = 0.0
    return w


def row_columns(rng: np.random.Generator, n_rows: int) -> dict[str, np.ndarray]:
    """A cache tier's metadata columns with random contents (some freq near saturation)."""
    freq = rng.integers(0, 1000, n_rows).astype(np.uint32)
    freq[rng.random(n_rows) < 0.1] = FREQ_MAX - rng.integers(0, 3, 1).astype(np.uint32)
    return {
        "freq": freq,
        "last_step": rng.integers(-5, 50, n_rows).astype(np.int64),
        "versions": rng.integers(0, 2**40, n_rows).astype(np.uint64),
        "is_dirty": rng.random(n_rows) < 0.5,
        "is_pinned": rng.random(n_rows) < 0.1,
        "flags": (rng.random(n_rows) < 0.2).astype(np.uint8) * FROZEN
        | (rng.random(n_rows) < 0.3).astype(np.uint8) * np.uint8(2),
    }


def batch_rows(rng: np.random.Generator, n_rows: int, u: int) -> np.ndarray:
    """u distinct rows of the slab, some -1 (keys without a row)."""
    rows = rng.permutation(n_rows)[:u].astype(np.int64)
    rows[rng.random(u) < 0.3] = -1
    return rows


# -- hash index ---------------------------------------------------------------------------


@case("hash_insert", "hash_find", "hash_remove", n=[0, 1, 700, 30_000])
def insert_find_remove(k: Any, rng: np.random.Generator, n: int) -> Results:
    keys = random_keys(rng, n)
    rows = rng.permutation(keys.shape[0]).astype(np.int64)
    absent = random_keys(rng, 50)
    absent = absent[~np.isin(absent, keys)]
    probe = rng.permutation(np.concatenate([keys, absent]))
    gone = keys[rng.random(keys.shape[0]) < 0.4]
    gone = np.concatenate([gone, absent[:5], gone[:3]])  # absent keys and repeats too
    slots = empty_index(65536)
    k.hash_insert(slots, keys, rows)
    found = np.empty(probe.shape[0], dtype=np.int64)
    k.hash_find(slots, probe, found)
    removed = np.empty(gone.shape[0], dtype=np.int64)
    k.hash_remove(slots, gone, removed)
    after = np.empty(probe.shape[0], dtype=np.int64)
    k.hash_find(slots, probe, after)
    return found, removed, after, int(np.count_nonzero(slots[:, 1] >= 0))


@case("hash_insert", "hash_find")
def insert_assigns_existing_key(k: Any, rng: np.random.Generator) -> Results:
    slots = empty_index(16)
    k.hash_insert(slots, np.array([5, 5, -1], np.int64), np.array([1, 2, 3], np.int64))
    out = np.empty(2, dtype=np.int64)
    k.hash_find(slots, np.array([5, -1], dtype=np.int64), out)
    assert out.tolist() == [2, 3]  # the last occurrence of a key wins
    return out, int(np.count_nonzero(slots[:, 1] >= 0))


@case("probe_gather", n_probe=[0, 1, 999, 40_000])  # 40k takes the parallel variant
def probe_gather(k: Any, rng: np.random.Generator, n_probe: int) -> Results:
    dim = 7
    keys = random_keys(rng, 400)
    values = rng.standard_normal((keys.shape[0], dim)).astype(np.float32)
    last_step = rng.integers(0, 10, keys.shape[0]).astype(np.int64)
    pool = np.concatenate([keys, random_keys(rng, 300)])
    probe = pool[rng.integers(0, keys.shape[0] + 300, n_probe)]
    slots = empty_index(1024)
    k.hash_insert(slots, keys, np.arange(keys.shape[0], dtype=np.int64))
    out = np.full((n_probe, dim), np.nan, dtype=np.float32)  # stays NaN where missing
    out_rows = np.empty(n_probe, dtype=np.int64)
    missing = k.probe_gather(slots, values, last_step, probe, 5, out, out_rows)
    if n_probe > 100:
        assert 0 < missing < n_probe  # both hits and misses were exercised
    return int(missing), out, out_rows


@case("unique_inverse", n_pool=[(0, 1), (1, 1), (5000, 300), (2000, 100_000)])
def unique_inverse(k: Any, rng: np.random.Generator, n_pool: tuple[int, int]) -> Results:
    n, pool = n_pool
    keys = random_keys(rng, n, dup_from=pool)[:n]
    u_out, inv, cnt = np.empty(n, np.int64), np.empty(n, np.int64), np.zeros(n, np.int64)
    scratch = empty_index(16384)
    u = k.unique_inverse(keys, scratch, u_out, inv, cnt)
    assert (scratch[:, 1] == -1).all()  # left empty for the next call
    return int(u), u_out[:u], inv, cnt[:u]


@case("unique_sampled", n_pool=[(0, 1), (1, 1), (5000, 300), (2000, 100_000)], rate=[0, 0.3, 1])
def unique_sampled(
    k: Any, rng: np.random.Generator, n_pool: tuple[int, int], rate: float
) -> Results:
    n, pool = n_pool
    keys = random_keys(rng, n, dup_from=pool)[:n]
    outs = [np.empty(n, np.int64) for _ in range(3)]
    kept, hashes = np.empty(n, np.int64), np.empty(n, np.uint64)
    threshold = np.uint64(round(rate * 2**53))  # rate 1 keeps every key
    scratch = empty_index(16384)
    u, m, d = k.unique_sampled(keys, np.uint64(0x5EED), threshold, scratch, *outs, kept, hashes)
    assert (scratch[:, 1] == -1).all()  # left empty for the next call
    return int(u), outs[0][:u], outs[1], outs[2][:u], kept[:m], hashes[:d]


@case("unique_rows", n_pool=[(0, 1), (1, 1), (5000, 300), (3000, 100_000)])
def unique_rows(k: Any, rng: np.random.Generator, n_pool: tuple[int, int]) -> Results:
    n, pool = n_pool
    keys = random_keys(rng, n, dup_from=pool)[:n]
    # about half the distinct keys have a row (numbered arbitrarily), the others none
    distinct = np.unique(keys)
    row_of = dict(zip(distinct.tolist(), rng.permutation(distinct.shape[0]).tolist(), strict=True))
    rows = np.array([row_of[x] if x % 2 else -1 for x in keys.tolist()], dtype=np.int64)
    mark = np.full(max(distinct.shape[0], 1), -1, np.int32)
    scratch = empty_index(16384)
    u_out, inv = np.empty(n, np.int64), np.empty(n, np.int64)
    cnt, r_out = np.zeros(n, np.int64), np.empty(n, np.int64)
    u = k.unique_rows(keys, rows, mark, scratch, u_out, inv, cnt, r_out)
    assert (mark == -1).all() and (scratch[:, 1] == -1).all()  # both left empty
    return int(u), u_out[:u], inv, cnt[:u], r_out[:u]


@case("sketch_add", n_hashes_width=[(1, 97), (4, 1000), (7, 64)])
def sketch_add(k: Any, rng: np.random.Generator, n_hashes_width: tuple[int, int]) -> Results:
    n_hashes, width = n_hashes_width
    keys = random_keys(rng, 300)
    counts = rng.integers(1, 40, keys.shape[0]).astype(np.int64)  # saturates small filters
    counters = rng.integers(0, 255, width).astype(np.uint8)
    est = np.empty(keys.shape[0], dtype=np.int64)
    k.sketch_add(counters, keys, counts, n_hashes, np.uint64(99), est)
    return counters, est


@case("bloom_add", "bloom_query", n_hashes_words=[(1, 3), (7, 16), (4, 1)])
def bloom_add_query(k: Any, rng: np.random.Generator, n_hashes_words: tuple[int, int]) -> Results:
    n_hashes, words = n_hashes_words
    added, other = random_keys(rng, 200), random_keys(rng, 500)
    bits = rng.integers(0, 2**63, words).astype(np.uint64) & np.uint64(0x0F0F0F0F0F0F0F0F)
    k.bloom_add(bits, added, n_hashes, np.uint64(7))
    queried = np.concatenate([added, other])
    hit = np.empty(queried.shape[0], dtype=bool)
    k.bloom_query(bits, queried, n_hashes, np.uint64(7), hit)
    assert hit[: added.shape[0]].all()  # no false negative
    if words == 16:  # 16 x 64 bits for ~200 keys: mostly true negatives
        assert hit[added.shape[0] :].mean() < 0.5
    return bits, hit


# -- initializers -------------------------------------------------------------------------

FILL_SIZES = [(0, 4), (1, 1), (3000, 16), (5000, 32)]  # 5000 keys: the parallel variant


@case("fill_uniform", n_dim=FILL_SIZES)  # no transcendental: bit-exact
def fill_uniform(k: Any, rng: np.random.Generator, n_dim: tuple[int, int]) -> Results:
    n, dim = n_dim
    keys = random_keys(rng, n)[:n]
    out = np.empty((n, dim), np.float32)
    k.fill_uniform(keys, np.uint64(7), -0.5, 2.0, out)
    return (out,)


def _almost_always_exact(got: Results, want: Results) -> None:
    if got[0].size:
        assert np.mean(got[0] == want[0]) > 0.999


# log/cos of numpy and of LLVM's libm may differ by an ulp in float64; after rounding to
# float32 the results agree to one float32 ulp (and almost always exactly).
@case("fill_normal", rtol=2e-7, atol=1e-7, also=_almost_always_exact, n_dim=FILL_SIZES)
def fill_normal(
    k: Any, rng: np.random.Generator, n_dim: tuple[int, int], truncate: bool = False
) -> Results:
    n, dim = n_dim
    keys = random_keys(rng, n)[:n]
    out = np.empty((n, dim), np.float32)
    k.fill_normal(keys, np.uint64(11), 1.0, 0.5, truncate, out)
    if truncate and n:
        assert np.abs(out - 1.0).max() <= 2 * 0.5  # every redraw landed within 2 std
    return (out,)


@case("fill_normal", rtol=2e-7, atol=1e-7, also=_almost_always_exact, n_dim=FILL_SIZES)
def fill_normal_truncated(k: Any, rng: np.random.Generator, n_dim: tuple[int, int]) -> Results:
    return fill_normal(k, rng, n_dim, truncate=True)


# -- bags ---------------------------------------------------------------------------------


@case(
    "probe_gather_combine",
    rtol=RTOL,
    atol=ATOL,
    combiner=[0, 1, 2],
    max_norm=[INF, 0.5],
    weighted=[False, True],
    init_kind=[0, 1, 2, 3],
    n_bags=[300, 12_000],  # ~30k keys: the parallel driver
)
def probe_gather_combine(
    k: Any,
    rng: np.random.Generator,
    combiner: int,
    max_norm: float,
    weighted: bool,
    init_kind: int,
    n_bags: int,
) -> Results:
    dim = 9
    stored = random_keys(rng, 500)
    values = rng.standard_normal((stored.shape[0], dim)).astype(np.float32)
    last_step = rng.integers(0, 10, stored.shape[0]).astype(np.int64)
    bounds = random_bags(rng, n_bags, 6)
    pool = np.concatenate([stored, random_keys(rng, 100)])  # some keys were never stored
    keys = pool[rng.integers(0, pool.shape[0], int(bounds[-1]))]  # duplicates inside bags too
    weights = weights_for(rng, bounds, weighted)
    slots = empty_index(2048)
    k.hash_insert(slots, stored, np.arange(stored.shape[0], dtype=np.int64))
    out = np.full((bounds.shape[0] - 1, dim), np.nan, np.float32)
    missing = k.probe_gather_combine(
        slots, values, last_step, keys, bounds, weights, 4, combiner, max_norm,
        init_kind, np.uint64(3), -0.25, 0.5, out,
    )  # fmt: skip
    assert missing > 0
    assert (out[np.diff(bounds) == 0] == 0).all()  # an empty bag combines to zeros
    return int(missing), out


@case(
    "gather_combine",
    "combine_backward",
    rtol=RTOL,
    atol=ATOL,
    combiner=[0, 1, 2],
    max_norm=[INF, 1.0],
    n_bags=[60, 12_000],  # ~25k positions: gather_combine in parallel
)
def gather_combine_and_backward(
    k: Any, rng: np.random.Generator, combiner: int, max_norm: float, n_bags: int
) -> Results:
    dim, u = 7, 40 if n_bags < 1000 else 4000  # a few positions per key, as in a real batch
    rows = rng.standard_normal((u, dim)).astype(np.float32)
    bounds = random_bags(rng, n_bags, 5)
    inverse = rng.integers(0, u, int(bounds[-1])).astype(np.int64)
    weights = weights_for(rng, bounds, True)
    grad_out = rng.standard_normal((bounds.shape[0] - 1, dim)).astype(np.float32)
    out = np.empty((bounds.shape[0] - 1, dim), np.float32)
    k.gather_combine(rows, inverse, bounds, weights, combiner, max_norm, out)
    grad = np.full((u, dim), np.nan, np.float32)
    k.combine_backward(grad_out, rows, inverse, bounds, weights, combiner, max_norm, grad)
    return out, grad


# -- fused update -------------------------------------------------------------------------


@case("group_positions")
def group_positions(k: Any, rng: np.random.Generator) -> Results:
    inverse = rng.integers(0, 50, 1000).astype(np.int64)
    counts = np.bincount(inverse, minlength=60)
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    out = np.empty(1000, np.int64)
    k.group_positions(inverse, bounds, out)
    return (out,)


HYPER = {
    0: [0.1, 0.01, 0.05],  # SGD: lr, weight_decay, group_lasso
    1: [0.1, 1e-10, 0.01, 0.05],  # Adagrad
    2: [0.01, 0.9, 0.999, 1e-8],  # Adam: step size, betas, eps
    3: [0.1, -0.5, 0.01, 0.1],  # FTRL
    4: [0.1, -0.5, 0.5, 0.1],  # group FTRL: l1 large enough to zero some rows
    5: [0.1, 1.0, 0.9, 0.1],  # Adagrad decay, decaying this step
    6: [0.1, 1e-8],  # row-wise Adagrad
}
SLOTS = {0: 0, 1: 1, 2: 2, 3: 2, 4: 2, 5: 1, 6: -1}  # blocks of dim (-1: one column)


@case(
    "segment_sum_apply",
    rtol=RTOL,
    atol=ATOL,
    kind=sorted(HYPER),
    per_position=[False, True],
    size=["small", "large"],  # large: the parallel driver
)
def segment_sum_apply(
    k: Any, rng: np.random.Generator, kind: int, per_position: bool, size: str
) -> Results:
    dim, n_rows, u = (6, 30, 12) if size == "small" else (6, 40_000, 20_000)
    n_slots = 1 if SLOTS[kind] == -1 else SLOTS[kind] * dim
    start = rng.standard_normal((n_rows, dim)).astype(np.float32)
    slots = rng.uniform(0.1, 1.0, (n_rows, n_slots)).astype(np.float32)
    if kind in (3, 4):  # z may be any sign; n must stay positive
        slots[:, dim:] = rng.standard_normal((n_rows, dim))
    rows = rng.permutation(n_rows)[:u].astype(np.int64)
    rows[3] = -1  # a key without a row: its gradient is dropped
    if per_position:
        n_pos = 40 if size == "small" else 50_000
        inverse = rng.integers(0, u, n_pos).astype(np.int64)
        counts = np.bincount(inverse, minlength=u)
        bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        positions = np.argsort(inverse, kind="stable").astype(np.int64)
        grads = rng.standard_normal((n_pos, dim)).astype(np.float32)
    else:
        bounds = np.arange(u + 1, dtype=np.int64)
        positions = np.arange(u, dtype=np.int64)
        grads = rng.standard_normal((u, dim)).astype(np.float32)
    hyper = np.array(HYPER[kind] + [0.0] * (8 - len(HYPER[kind])))
    values = start.copy()
    k.segment_sum_apply(grads, positions, bounds, rows, kind, hyper, values, slots)
    untouched = np.setdiff1d(np.arange(n_rows), rows[rows >= 0])
    np.testing.assert_array_equal(values[untouched], start[untouched])
    assert not np.array_equal(values, start)
    return values, slots


# -- row bookkeeping ----------------------------------------------------------------------


@case(
    "stamp_gather_pulled",
    # serial (small) and parallel (from 4,096 rows) variants alike
    n_rows_u_dim=[(1, 0, 3), (1, 1, 1), (50, 40, 5), (20_000, 5_000, 64), (70_000, 40_000, 17)],
)
def stamp_gather_pulled(
    k: Any, rng: np.random.Generator, n_rows_u_dim: tuple[int, int, int]
) -> Results:
    n_rows, u, dim = n_rows_u_dim
    c = row_columns(rng, n_rows)
    values = rng.standard_normal((n_rows, dim)).astype(np.float32)
    rows = batch_rows(rng, n_rows, u)
    counts = rng.integers(1, 6, u).astype(np.int64)
    step, version = int(rng.integers(0, 100)), int(rng.integers(1, 2**40))
    out = np.full((u, dim), 7.0, dtype=np.float32)
    n = k.stamp_gather_pulled(
        rows, counts, step, version, int(FREQ_MAX), c["freq"], c["last_step"],
        c["versions"], c["is_dirty"], c["is_pinned"], values, out,
    )  # fmt: skip
    have = rows >= 0
    assert n == int(np.count_nonzero(have))
    assert c["is_pinned"][rows[have]].all() and c["is_dirty"][rows[have]].all()
    np.testing.assert_array_equal(out[have], values[rows[have]])
    assert (out[~have] == 7.0).all()  # entries without a row are left as they were
    return int(n), out, c["freq"], c["last_step"], c["versions"], c["is_dirty"], c["is_pinned"]


@case("stamp_pushed", n_rows_u=[(1, 0), (1, 1), (50, 40), (20_000, 5_000)])
def stamp_pushed(k: Any, rng: np.random.Generator, n_rows_u: tuple[int, int]) -> Results:
    n_rows, u = n_rows_u
    c = row_columns(rng, n_rows)
    rows = batch_rows(rng, n_rows, u)
    step, version = int(rng.integers(0, 100)), int(rng.integers(1, 2**40))
    given = rows.copy()
    counted = k.stamp_pushed(
        rows, c["flags"], int(FROZEN), step, version, c["last_step"], c["versions"], c["is_dirty"]
    )
    have = given >= 0
    frozen = np.zeros(u, dtype=bool)
    frozen[have] = (c["flags"][given[have]] & FROZEN) != 0
    dropped_frozen = tuple(int(x) for x in counted)
    assert dropped_frozen == (int(np.count_nonzero(~have)), int(np.count_nonzero(frozen)))
    np.testing.assert_array_equal(rows, np.where(frozen, -1, given))  # frozen rows skipped
    return dropped_frozen, rows, c["last_step"], c["versions"], c["is_dirty"]


@case("clear_flags", h_n=[(1, 0), (10, 10), (5000, 300), (70_000, 65_536)])
def clear_flags(k: Any, rng: np.random.Generator, h_n: tuple[int, int]) -> Results:
    h, n = h_n
    flags = rng.random(h) < 0.7
    rows = rng.integers(0, h, n).astype(np.int64)  # repeats too
    k.clear_flags(flags, rows)
    assert not flags[rows].any()
    return (flags,)


def _victim_columns(rng: np.random.Generator, h: int) -> tuple[np.ndarray, ...]:
    is_live = rng.random(h) < 0.8
    is_pinned = rng.random(h) < 0.2
    is_protected = rng.random(h) < 0.1
    freq = rng.integers(0, 2**32, h, dtype=np.uint64).astype(np.uint32)
    freq[: h // 2] = rng.integers(0, 20, h // 2).astype(np.uint32)  # small counts, ties
    last_step = rng.integers(-50, 3000, h).astype(np.int64)
    return is_live, is_pinned, is_protected, freq, last_step


@case(
    "victim_candidates",
    rtol=1e-12,  # exp2 of numpy and of LLVM's libm
    h=[0, 1, 17, 5000],
    lfu=[True, False],
    min_live=[-(2**63), 100, 2500],
)
def victim_candidates(
    k: Any, rng: np.random.Generator, h: int, lfu: bool, min_live: int
) -> Results:
    cols = _victim_columns(rng, h)
    out = (np.full(h, -7, np.int64), np.full(h, np.nan), np.zeros(h, bool))
    m = k.victim_candidates(*cols, 2000, 300, min_live, lfu, *out)
    return (int(m), *(o[:m] for o in out))


# -- merge --------------------------------------------------------------------------------


def _sorted_rows(rng: np.random.Generator, n: int, pool: int, dim: int) -> tuple[np.ndarray, ...]:
    keys = np.sort(rng.choice(np.arange(-pool, pool, dtype=np.int64), n, replace=False))
    values = rng.standard_normal((n, dim)).astype(np.float32)
    steps = rng.integers(0, 100, n).astype(np.int64)
    removed = rng.random(n) < 0.2
    return keys, values, steps, removed


@case(
    "merge_newest",
    na_nb_pool=[(0, 0, 10), (0, 5, 10), (7, 0, 10), (50, 40, 60), (3000, 2000, 4000)],
)
def merge_newest(k: Any, rng: np.random.Generator, na_nb_pool: tuple[int, int, int]) -> Results:
    na, nb, pool = na_nb_pool
    dim = 5
    a, b = _sorted_rows(rng, na, pool, dim), _sorted_rows(rng, nb, pool, dim)
    out = (
        np.empty(na + nb, np.int64),
        np.empty((na + nb, dim), np.float32),
        np.empty(na + nb, np.int64),
        np.empty(na + nb, bool),
    )
    m = k.merge_newest(*a, *b, *out)
    keys, values = out[0][:m], out[1][:m]
    assert m == np.union1d(a[0], b[0]).shape[0] and (np.diff(keys) > 0).all()
    both = np.intersect1d(a[0], b[0])  # where both have a key, b's row wins
    at = np.searchsorted(keys, both)
    np.testing.assert_array_equal(values[at], b[1][np.searchsorted(b[0], both)])
    return (int(m), *(o[:m] for o in out))


# -- low precision: half-precision rows and quantised serving rows ------------------------

HALF = {"bfloat16": np.uint16, "float16": np.float16}


def awkward_floats(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """float32 over many binades, with exact halves, zeros of both signs, infinities, NaNs,
    float16 subnormals and values past float16's range."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 20, shape))
    x = x.astype(np.float32)
    flat = x.reshape(-1)
    special = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65520, -65519.99, 2**-25, 1 + 2**-8, 1e-40],
        np.float32,
    )
    if flat.size:
        at = rng.integers(0, flat.size, min(flat.size, 3 * special.size))
        flat[at] = special[np.arange(at.size) % special.size]
    return x


def _half_bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16)  # compare stored halves bit for bit (NaN payloads too)


@case(
    "round_rows",
    "widen_rows",
    fmt=sorted(HALF),
    stochastic=[False, True],
    n_dim=[(0, 3), (1, 1), (300, 7), (5000, 16)],  # 5000 rows: the parallel drivers
)
def round_and_widen_rows(
    k: Any, rng: np.random.Generator, fmt: str, stochastic: bool, n_dim: tuple[int, int]
) -> Results:
    n, dim = n_dim
    slab_rows = n + 10
    values = awkward_floats(rng, (n, dim))
    rows = batch_rows(rng, slab_rows, n)
    keys = random_keys(rng, n, dup_from=max(n // 2, 1))[:n]
    slab = rng.integers(0, 2**16, (slab_rows, dim)).astype(np.uint16).view(HALF[fmt])
    k.round_rows(values, rows, keys, np.uint64(2**63 + 5), -3, stochastic, slab)
    gather = rng.integers(-1, slab_rows, n + 3).astype(np.int64)
    out = np.full((n + 3, dim), 7.0, np.float32)
    k.widen_rows(slab, gather, out)
    assert (out[gather < 0] == 7.0).all()  # rows of -1 are left as they were
    return _half_bits(slab), out.view(np.uint32)


def quantized_table(
    rng: np.random.Generator, n: int, dim: int, bits: int, k: Any
) -> tuple[np.ndarray, np.ndarray]:
    """(values, q): random float32 rows (a constant row and a row of -0.0 among them) and
    their quantised rows, 16-byte aligned as FBGEMM pads them."""
    from evdb.kernels.reference.lowp import quantized_row_bytes

    values = (rng.standard_normal((n, dim)) * rng.uniform(0.2, 2, (n, 1))).astype(np.float32)
    if n > 2:
        values[1] = 3.25
        values[2] = -0.0
    q = np.full((n, quantized_row_bytes(dim, bits, align=16)), 0xAB, np.uint8)
    k.quantize_rows(values, bits, q)
    return values, q


@case("quantize_rows", "dequantize_rows", bits=[8, 4], n_dim=[(0, 4), (1, 1), (40, 7), (3000, 64)])
def quantize_dequantize_rows(
    k: Any, rng: np.random.Generator, bits: int, n_dim: tuple[int, int]
) -> Results:
    n, dim = n_dim
    _, q = quantized_table(rng, n, dim, bits, k)
    rows = rng.integers(-1, max(n, 1), n + 2).astype(np.int64) if n else np.full(2, -1, np.int64)
    out = np.full((rows.shape[0], dim), 7.0, np.float32)
    k.dequantize_rows(q, bits, rows, out)
    assert (out[rows < 0] == 7.0).all()
    return q, out


@case("probe_gather_dequantized", bits=[8, 4], n_probe=[0, 1, 999, 40_000])
def probe_gather_dequantized(k: Any, rng: np.random.Generator, bits: int, n_probe: int) -> Results:
    dim = 9
    keys = random_keys(rng, 400)
    _, q = quantized_table(rng, keys.shape[0], dim, bits, k)
    last_step = rng.integers(0, 10, keys.shape[0]).astype(np.int64)
    pool = np.concatenate([keys, random_keys(rng, 300)])
    probe = pool[rng.integers(0, pool.shape[0], n_probe)]
    slots = empty_index(1024)
    k.hash_insert(slots, keys, np.arange(keys.shape[0], dtype=np.int64))
    out = np.full((n_probe, dim), np.nan, np.float32)
    out_rows = np.empty(n_probe, np.int64)
    missing = k.probe_gather_dequantized(slots, q, bits, last_step, probe, 5, out, out_rows)
    if n_probe > 100:
        assert 0 < missing < n_probe
    return int(missing), out, out_rows


@case(
    "probe_gather_combine_dequantized",
    rtol=RTOL,
    atol=ATOL,
    bits=[8, 4],
    combiner=[0, 1, 2],
    max_norm=[INF, 0.5],
    n_bags=[300, 12_000],
)
def probe_gather_combine_dequantized(
    k: Any, rng: np.random.Generator, bits: int, combiner: int, max_norm: float, n_bags: int
) -> Results:
    dim = 9
    stored = random_keys(rng, 500)
    _, q = quantized_table(rng, stored.shape[0], dim, bits, k)
    last_step = rng.integers(0, 10, stored.shape[0]).astype(np.int64)
    bounds = random_bags(rng, n_bags, 6)
    pool = np.concatenate([stored, random_keys(rng, 100)])
    keys = pool[rng.integers(0, pool.shape[0], int(bounds[-1]))]
    weights = weights_for(rng, bounds, True)
    slots = empty_index(2048)
    k.hash_insert(slots, stored, np.arange(stored.shape[0], dtype=np.int64))
    out = np.full((bounds.shape[0] - 1, dim), np.nan, np.float32)
    missing = k.probe_gather_combine_dequantized(
        slots, q, bits, last_step, keys, bounds, weights, 4, combiner, max_norm,
        2, np.uint64(3), -0.25, 0.5, out,
    )  # fmt: skip
    assert missing > 0
    assert (out[np.diff(bounds) == 0] == 0).all()
    return int(missing), out


def frozen_table(
    rng: np.random.Generator, n: int, dim: int, bits: int, k: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(directory, keys, q) of a frozen table of n random rows (``reference.frozen``'s
    layout: keys in mix64 order, a bucket directory; rows 16-byte aligned)."""
    from evdb.kernels.reference.frozen import bucket_count, frozen_order

    keys = random_keys(rng, n)
    _, q = quantized_table(rng, keys.shape[0], dim, bits, k)
    order, directory = frozen_order(keys, bucket_count(keys.shape[0]))
    return directory, keys[order], np.ascontiguousarray(q[order])


@case("search_gather_dequantized", bits=[8, 4], n_probe=[0, 1, 999, 40_000])
def search_gather_dequantized(k: Any, rng: np.random.Generator, bits: int, n_probe: int) -> Results:
    dim = 9
    directory, stored, q = frozen_table(rng, 400, dim, bits, k)
    pool = np.concatenate([stored, random_keys(rng, 300)])
    probe = pool[rng.integers(0, pool.shape[0], n_probe)]
    out = np.full((n_probe, dim), np.nan, np.float32)
    out_rows = np.empty(n_probe, np.int64)
    missing = k.search_gather_dequantized(directory, stored, q, bits, probe, out, out_rows)
    if n_probe > 100:
        assert 0 < missing < n_probe
    assert np.isnan(out[out_rows < 0]).all()  # untouched where not found
    return int(missing), out, out_rows


@case(
    "search_gather_combine_dequantized",
    rtol=RTOL,
    atol=ATOL,
    bits=[8, 4],
    combiner=[0, 1, 2],
    max_norm=[INF, 0.5],
    n_bags=[300, 12_000],
)
def search_gather_combine_dequantized(
    k: Any, rng: np.random.Generator, bits: int, combiner: int, max_norm: float, n_bags: int
) -> Results:
    dim = 9
    directory, stored, q = frozen_table(rng, 500, dim, bits, k)
    bounds = random_bags(rng, n_bags, 6)
    pool = np.concatenate([stored, random_keys(rng, 100)])
    keys = pool[rng.integers(0, pool.shape[0], int(bounds[-1]))]
    weights = weights_for(rng, bounds, True)
    out = np.full((bounds.shape[0] - 1, dim), np.nan, np.float32)
    missing = k.search_gather_combine_dequantized(
        directory, stored, q, bits, keys, bounds, weights, combiner, max_norm,
        2, np.uint64(3), -0.25, 0.5, out,
    )  # fmt: skip
    assert missing > 0
    assert (out[np.diff(bounds) == 0] == 0).all()
    return int(missing), out


def half_table(rng: np.random.Generator, n: int, dim: int, fmt: str) -> np.ndarray:
    """(n, dim) random rows stored in fmt (float16, or bfloat16 as uint16 bits)."""
    x = rng.standard_normal((n, dim)).astype(np.float32)
    if fmt == "float16":
        return x.astype(np.float16)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


@case("probe_gather_widened", fmt=sorted(HALF), n_probe=[0, 1, 999, 40_000])
def probe_gather_widened(k: Any, rng: np.random.Generator, fmt: str, n_probe: int) -> Results:
    dim = 9
    keys = random_keys(rng, 400)
    values = half_table(rng, keys.shape[0], dim, fmt)
    values.view(np.uint16)[0, 0] = 0x7FC1 if fmt == "bfloat16" else 0x7E01  # a NaN's payload
    last_step = rng.integers(0, 10, keys.shape[0]).astype(np.int64)
    pool = np.concatenate([keys, random_keys(rng, 300)])
    probe = pool[rng.integers(0, pool.shape[0], n_probe)]
    slots = empty_index(1024)
    k.hash_insert(slots, keys, np.arange(keys.shape[0], dtype=np.int64))
    out = np.full((n_probe, dim), 7.0, np.float32)
    out_rows = np.empty(n_probe, np.int64)
    missing = k.probe_gather_widened(slots, values, last_step, probe, 5, out, out_rows)
    if n_probe > 100:
        assert 0 < missing < n_probe
    return int(missing), out.view(np.uint32), out_rows


@case(
    "probe_gather_combine_widened",
    rtol=RTOL,
    atol=ATOL,
    fmt=sorted(HALF),
    combiner=[0, 1, 2],
    max_norm=[INF, 0.5],
    n_bags=[300, 12_000],
)
def probe_gather_combine_widened(
    k: Any, rng: np.random.Generator, fmt: str, combiner: int, max_norm: float, n_bags: int
) -> Results:
    dim = 9
    stored = random_keys(rng, 500)
    values = half_table(rng, stored.shape[0], dim, fmt)
    last_step = rng.integers(0, 10, stored.shape[0]).astype(np.int64)
    bounds = random_bags(rng, n_bags, 6)
    pool = np.concatenate([stored, random_keys(rng, 100)])
    keys = pool[rng.integers(0, pool.shape[0], int(bounds[-1]))]
    weights = weights_for(rng, bounds, True)
    slots = empty_index(2048)
    k.hash_insert(slots, stored, np.arange(stored.shape[0], dtype=np.int64))
    out = np.full((bounds.shape[0] - 1, dim), np.nan, np.float32)
    missing = k.probe_gather_combine_widened(
        slots, values, last_step, keys, bounds, weights, 4, combiner, max_norm,
        3, np.uint64(3), -0.25, 0.5, out,
    )  # fmt: skip
    assert missing > 0
    assert (out[np.diff(bounds) == 0] == 0).all()
    return int(missing), out


def _nearly_all_bits_equal(got: Results, want: Results) -> None:
    # The float32 sums differ in their last bit now and then between backends; a stochastic
    # rounding of two such values may then land one half-precision ulp apart. Rarely.
    assert np.mean(got[0] == want[0]) > 0.99


@case(
    "segment_sum_apply_lowp",
    rtol=2**-7,  # one bfloat16 ulp; see _nearly_all_bits_equal
    atol=1e-6,
    also=_nearly_all_bits_equal,
    kind=[0, 1, 2, 6],
    fmt=sorted(HALF),
    stochastic=[False, True],
    size=["small", "large"],
)
def segment_sum_apply_lowp(
    k: Any, rng: np.random.Generator, kind: int, fmt: str, stochastic: bool, size: str
) -> Results:
    dim, n_rows, u = (6, 30, 12) if size == "small" else (6, 40_000, 20_000)
    n_slots = 1 if SLOTS[kind] == -1 else SLOTS[kind] * dim
    start32 = rng.standard_normal((n_rows, dim)).astype(np.float32)
    start = start32.astype(np.float16) if fmt == "float16" else (start32.view(np.uint32) >> 16)
    start = start.astype(HALF[fmt])
    slots = rng.uniform(0.1, 1.0, (n_rows, n_slots)).astype(np.float32)
    rows = rng.permutation(n_rows)[:u].astype(np.int64)
    rows[3] = -1
    row_keys = random_keys(rng, n_rows)[:n_rows]  # the key of each row
    n_pos = 40 if size == "small" else 50_000
    inverse = rng.integers(0, u, n_pos).astype(np.int64)
    bounds = np.concatenate([[0], np.cumsum(np.bincount(inverse, minlength=u))]).astype(np.int64)
    positions = np.argsort(inverse, kind="stable").astype(np.int64)
    grads = rng.standard_normal((n_pos, dim)).astype(np.float32)
    hyper = np.array(HYPER[kind] + [0.0] * (8 - len(HYPER[kind])))
    values = start.copy()
    k.segment_sum_apply_lowp(
        grads, positions, bounds, rows, row_keys, kind, hyper, 77, 12, stochastic, values, slots
    )
    untouched = np.setdiff1d(np.arange(n_rows), rows[rows >= 0])
    np.testing.assert_array_equal(_half_bits(values[untouched]), _half_bits(start[untouched]))
    assert not np.array_equal(values, start)
    from evdb.kernels.reference.lowp import widen

    return widen(values), slots


def _nearly_all_row_and_slot_bits_equal(got: Results, want: Results) -> None:
    # as _nearly_all_bits_equal, for the slots too: a slot rounded with another column's
    # random bits (not dim + j) would differ in far more than 1% of them
    for g, w in zip(got, want, strict=True):
        assert np.mean(g == w) > 0.99


@case(
    "segment_sum_apply_lowp",
    rtol=2**-7,  # one bfloat16 ulp; see _nearly_all_bits_equal
    atol=1e-6,
    also=_nearly_all_row_and_slot_bits_equal,
    kind=[1, 2, 6],
    fmt=sorted(HALF),
    stochastic=[False, True],
    size=["small", "large"],
)
def segment_sum_apply_lowp_half_slots(
    k: Any, rng: np.random.Generator, kind: int, fmt: str, stochastic: bool, size: str
) -> Results:
    # slots stored in the values' format (a table's slot_dtype), rounded with the row
    dim, n_rows, u = (6, 30, 12) if size == "small" else (6, 40_000, 20_000)
    n_slots = 1 if SLOTS[kind] == -1 else SLOTS[kind] * dim
    halves = []
    for shape, low in (((n_rows, dim), None), ((n_rows, n_slots), 0.1)):
        x = rng.standard_normal(shape) if low is None else rng.uniform(low, 1.0, shape)
        x32 = x.astype(np.float32)
        h = x32.astype(np.float16) if fmt == "float16" else (x32.view(np.uint32) >> 16)
        halves.append(h.astype(HALF[fmt]))
    start, slots0 = halves
    rows = rng.permutation(n_rows)[:u].astype(np.int64)
    rows[3] = -1
    row_keys = random_keys(rng, n_rows)[:n_rows]
    n_pos = 40 if size == "small" else 50_000
    inverse = rng.integers(0, u, n_pos).astype(np.int64)
    bounds = np.concatenate([[0], np.cumsum(np.bincount(inverse, minlength=u))]).astype(np.int64)
    positions = np.argsort(inverse, kind="stable").astype(np.int64)
    grads = rng.standard_normal((n_pos, dim)).astype(np.float32)
    hyper = np.array(HYPER[kind] + [0.0] * (8 - len(HYPER[kind])))
    values, slots = start.copy(), slots0.copy()
    k.segment_sum_apply_lowp(
        grads, positions, bounds, rows, row_keys, kind, hyper, 77, 12, stochastic, values, slots
    )
    untouched = np.setdiff1d(np.arange(n_rows), rows[rows >= 0])
    np.testing.assert_array_equal(_half_bits(slots[untouched]), _half_bits(slots0[untouched]))
    assert slots.dtype == slots0.dtype and not np.array_equal(slots, slots0)
    from evdb.kernels.reference.lowp import widen

    return widen(values), widen(slots)
