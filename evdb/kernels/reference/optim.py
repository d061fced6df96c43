"""Reference fused update: segment-sum the gradients of each row, then apply an optimizer.

``segment_sum_apply(grads, positions, bounds, rows, kind, hyper, values, slots)``:
row ``rows[u]`` (skipped when -1) receives ``g_u = sum(grads[positions[bounds[u]:bounds[u+1]]])``
and is updated in place, with its slot columns, by the rule ``kind`` whose scalars are
``hyper`` (float64). Slots of a row are laid out per kind as below (each block ``dim`` wide
unless said). Every rule is computed here in float64 and stored back as float32.

====  ===============  ======================================  ==========================
kind  rule             hyper                                    slots
====  ===============  ======================================  ==========================
0     SGD              lr, weight_decay, group_lasso            -
1     Adagrad          lr, eps, weight_decay, group_lasso       acc
2     Adam (lazy)      step_size, beta1, beta2, eps             m, v
3     FTRL             lr, lr_power, l1, l2                     n, z
4     group FTRL       lr, lr_power, l1, l2                     n, z
5     Adagrad decay    lr, decay_now, decay_rate, initial_acc   acc
6     row-wise Adagr.  lr, eps                                  acc (1 column)
====  ===============  ======================================  ==========================
"""

from __future__ import annotations

import numpy as np

from evdb.kernels import OptimizerKind

SGD, ADAGRAD, ADAM = OptimizerKind.SGD, OptimizerKind.ADAGRAD, OptimizerKind.ADAM
FTRL, GROUP_FTRL = OptimizerKind.FTRL, OptimizerKind.GROUP_FTRL
ADAGRAD_DECAY, ROWWISE_ADAGRAD = OptimizerKind.ADAGRAD_DECAY, OptimizerKind.ROWWISE_ADAGRAD


def group_positions(inverse: np.ndarray, bounds: np.ndarray, out: np.ndarray) -> None:
    """Positions grouped by key: out[bounds[u]:bounds[u+1]] are the positions p with
    inverse[p] == u, in increasing order (a stable counting sort; bounds from the counts)."""
    out[:] = np.argsort(inverse, kind="stable")


def _prox_group_lasso(w: np.ndarray, lr: float, strength: float) -> np.ndarray:
    """Proximal step of ``strength * |w|_2`` per row (Yuan & Lin 2006): rows shrink toward 0
    and become exactly 0 once their norm is below ``lr * strength``."""
    if strength == 0:
        return w
    norm = np.linalg.norm(w, axis=1, keepdims=True)
    return w * np.maximum(0.0, 1.0 - lr * strength / np.where(norm > 0, norm, 1.0))


def _ftrl_power(n: np.ndarray, lr_power: float) -> np.ndarray:
    return np.sqrt(n) if lr_power == -0.5 else n ** (-lr_power)


def apply_rule(
    kind: int, hyper: np.ndarray, w: np.ndarray, s: np.ndarray, g: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """New (w, s) of rows w (k, dim) with slots s (k, n_slots) after gradients g (k, dim)."""
    dim = w.shape[1]
    s = s.copy()
    if kind == SGD:
        lr, wd, lasso = hyper[:3]
        w = w - lr * (g + wd * w)
        return _prox_group_lasso(w, lr, lasso), s
    if kind == ADAGRAD:  # torch.optim.Adagrad (initial_accumulator_value, lr_decay=0)
        lr, eps, wd, lasso = hyper[:4]
        g = g + wd * w
        acc = s[:, :dim] + g * g
        s[:, :dim] = acc
        w = w - lr * g / (np.sqrt(acc) + eps)
        return _prox_group_lasso(w, lr, lasso), s
    if kind == ADAM:  # torch.optim.SparseAdam: step_size = lr sqrt(1 - b2^t) / (1 - b1^t)
        step_size, b1, b2, eps = hyper[:4]
        m = b1 * s[:, :dim] + (1 - b1) * g
        v = b2 * s[:, dim:] + (1 - b2) * g * g
        s[:, :dim], s[:, dim:] = m, v
        return w - step_size * m / (np.sqrt(v) + eps), s
    if kind in (FTRL, GROUP_FTRL):  # TF ApplyFtrl; DeepRec's group (row-wise) variant
        lr, lr_power, l1, l2 = hyper[:4]
        n, z = s[:, :dim], s[:, dim:]
        n_new = n + g * g
        z = z + g - (_ftrl_power(n_new, lr_power) - _ftrl_power(n, lr_power)) / lr * w
        quad = _ftrl_power(n_new, lr_power) / lr + 2 * l2
        if kind == FTRL:
            w = np.where(np.abs(z) > l1, (np.sign(z) * l1 - z) / quad, 0.0)
        else:
            zn = np.linalg.norm(z, axis=1, keepdims=True)
            unit = z / np.where(zn > 0, zn, 1.0)
            w = np.where(zn > l1, (l1 * unit - z) / quad, 0.0)
        s[:, :dim], s[:, dim:] = n_new, z
        return w, s
    if kind == ADAGRAD_DECAY:  # DeepRec AdagradDecayV2: var -= lr * g / sqrt(acc)
        lr, decay_now, rate, init_acc = hyper[:4]
        acc = s[:, :dim]
        if decay_now:
            acc = np.maximum(acc * rate, init_acc)
        acc = acc + g * g
        s[:, :dim] = acc
        return w - lr * g / np.sqrt(acc), s
    if kind == ROWWISE_ADAGRAD:  # FBGEMM's row-wise Adagrad: one accumulator per row
        lr, eps = hyper[:2]
        acc = s[:, :1] + (g * g).mean(axis=1, keepdims=True)
        s[:, :1] = acc
        return w - lr * g / (np.sqrt(acc) + eps), s
    raise ValueError(f"unknown optimizer kind {kind}")


def segment_sum_apply(
    grads: np.ndarray,
    positions: np.ndarray,
    bounds: np.ndarray,
    rows: np.ndarray,
    kind: int,
    hyper: np.ndarray,
    values: np.ndarray,
    slots: np.ndarray,
) -> None:
    """Sum each row's gradient over its positions, then apply rule ``kind`` in place."""
    u = rows.shape[0]
    seg = np.repeat(np.arange(u), np.diff(bounds))
    g = np.zeros((u, grads.shape[1]))
    np.add.at(g, seg, grads[positions].astype(np.float64))
    live = rows >= 0
    r = rows[live]
    w, s = apply_rule(
        kind, hyper, values[r].astype(np.float64), slots[r].astype(np.float64), g[live]
    )
    values[r] = w
    slots[r] = s
