"""Reference bag kernels: combine the rows of each bag into one vector, and its backward.

Conventions shared by every backend:

* ``bounds (B + 1,) int64``: bag b holds positions ``bounds[b] : bounds[b + 1]`` (the public
  ``offsets`` of torch.nn.EmbeddingBag with the end appended); empty bags are allowed.
* ``weights (n,) float32``: per-position weights (all ones for an unweighted lookup).
* ``combiner``: 0 = sum ``sum(w x)``, 1 = mean ``sum(w x) / sum(w)``, 2 = sqrtn
  ``sum(w x) / sqrt(sum(w^2))`` (TF's safe_embedding_lookup_sparse); a bag whose divisor is 0
  (empty, or zero weights) gives zeros, as TF's ``div_no_nan`` does.
* ``max_norm``: each looked-up vector x is first scaled by ``max_norm / (|x| + 1e-7)`` when
  ``|x| > max_norm`` (torch's embedding_renorm_ rule, without writing the row back); ``inf``
  disables it. The backward differentiates through that scaling exactly.
* ``init_kind, init_seed, init_a, init_b``: the default value of a key without a live row:
  0 = constant a; 1 = uniform [a, b); 2 = normal(a, b); 3 = normal(a, b) truncated at 2 std.
"""

from __future__ import annotations

import numpy as np

from evdb.kernels.reference.index import probe_gather
from evdb.kernels.reference.init import fill_normal, fill_uniform

SUM, MEAN, SQRTN = 0, 1, 2
NORM_EPS = 1e-7


def default_rows(
    keys: np.ndarray, dim: int, init_kind: int, init_seed: int, init_a: float, init_b: float
) -> np.ndarray:
    """(n, dim) float32 default values of keys (see the module docstring for the kinds)."""
    out = np.empty((keys.shape[0], dim), dtype=np.float32)
    if init_kind == 0:
        out[:] = init_a
    elif init_kind == 1:
        fill_uniform(keys, init_seed, init_a, init_b, out)
    else:
        fill_normal(keys, init_seed, init_a, init_b, init_kind == 3, out)
    return out


def clip_scale(x: np.ndarray, max_norm: float) -> np.ndarray:
    """(n,) float64 factor that brings each row of x (n, dim) within max_norm."""
    norm = np.linalg.norm(x.astype(np.float64), axis=1)
    return np.where(norm > max_norm, max_norm / (norm + NORM_EPS), 1.0)


def bag_divisors(bounds: np.ndarray, weights: np.ndarray, combiner: int) -> np.ndarray:
    """(B,) float64 divisor of each bag: 1, sum(w) or sqrt(sum(w^2))."""
    n_bags = bounds.shape[0] - 1
    bag_of = np.repeat(np.arange(n_bags), np.diff(bounds))
    w = weights.astype(np.float64)
    if combiner == SUM:
        return np.ones(n_bags)
    if combiner == MEAN:
        return np.bincount(bag_of, weights=w, minlength=n_bags)
    return np.sqrt(np.bincount(bag_of, weights=w * w, minlength=n_bags))


def _combine(
    x: np.ndarray, bounds: np.ndarray, weights: np.ndarray, combiner: int, max_norm: float
) -> np.ndarray:
    """Combine the per-position rows x (n, dim) into (B, dim) float64."""
    n_bags = bounds.shape[0] - 1
    scaled = x.astype(np.float64) * (clip_scale(x, max_norm) * weights)[:, None]
    bag_of = np.repeat(np.arange(n_bags), np.diff(bounds))
    sums = np.zeros((n_bags, x.shape[1]))
    np.add.at(sums, bag_of, scaled)
    div = bag_divisors(bounds, weights, combiner)
    safe = np.where(div != 0, div, 1.0)
    return np.where((div != 0)[:, None], sums / safe[:, None], 0.0)


def probe_gather_combine(
    slots: np.ndarray,
    values: np.ndarray,
    last_step: np.ndarray,
    keys: np.ndarray,
    bounds: np.ndarray,
    weights: np.ndarray,
    min_live_step: int,
    combiner: int,
    max_norm: float,
    init_kind: int,
    init_seed: int,
    init_a: float,
    init_b: float,
    out: np.ndarray,
) -> int:
    """Fused hash probe + gather + combine: out (B, dim) float32 is the combination of each
    bag's rows, a key without a live row contributing its default value. Returns the number
    of keys without a live row. (This reference gathers an (n, dim) matrix; kernels must not.)
    """
    n, dim = keys.shape[0], values.shape[1]
    x = np.empty((n, dim), dtype=np.float32)
    rows = np.empty(n, dtype=np.int64)
    missing = probe_gather(slots, values, last_step, keys, min_live_step, x, rows)
    absent = rows < 0
    x[absent] = default_rows(keys[absent], dim, init_kind, init_seed, init_a, init_b)
    out[:] = _combine(x, bounds, weights, combiner, max_norm)
    return missing


def gather_combine(
    rows: np.ndarray,
    inverse: np.ndarray,
    bounds: np.ndarray,
    weights: np.ndarray,
    combiner: int,
    max_norm: float,
    out: np.ndarray,
) -> None:
    """Training-path combine: position p reads rows[inverse[p]] (rows (u, dim) of a pull)."""
    out[:] = _combine(rows[inverse], bounds, weights, combiner, max_norm)


def combine_backward(
    grad_out: np.ndarray,
    rows: np.ndarray,
    inverse: np.ndarray,
    bounds: np.ndarray,
    weights: np.ndarray,
    combiner: int,
    max_norm: float,
    out: np.ndarray,
) -> None:
    """Gradient of gather_combine: out (u, dim) = d loss / d rows, given grad_out (B, dim).

    Position p of bag b adds ``J_p^T (w_p / div_b) grad_out[b]`` to its key, where J_p is the
    Jacobian of the max_norm scaling at x = rows[inverse[p]]: ``s I`` when unclipped (s = 1),
    else ``s I - max_norm x x^T / (|x| (|x| + eps)^2)``.
    """
    n_bags = bounds.shape[0] - 1
    bag_of = np.repeat(np.arange(n_bags), np.diff(bounds))
    div = bag_divisors(bounds, weights, combiner)
    coef = np.where(div[bag_of] != 0, weights / np.where(div[bag_of] != 0, div[bag_of], 1), 0)
    g = grad_out.astype(np.float64)[bag_of] * coef[:, None]  # (n, dim)
    x = rows[inverse].astype(np.float64)
    norm = np.linalg.norm(x, axis=1)
    clipped = norm > max_norm
    if clipped.any():
        xc, nc, gc = x[clipped], norm[clipped], g[clipped]
        s = max_norm / (nc + NORM_EPS)
        proj = (xc * gc).sum(axis=1) * max_norm / (nc * (nc + NORM_EPS) ** 2)
        g[clipped] = s[:, None] * gc - proj[:, None] * xc
    acc = np.zeros((rows.shape[0], rows.shape[1]))
    np.add.at(acc, inverse, g)
    out[:] = acc
