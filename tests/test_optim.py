"""Optimizers through Table.push, each against a float64 model written here from its source's
formulas (independent of evdb.kernels.reference), over several steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import evdb
from evdb.errors import ConfigError

DIM, STEPS = 4, 6
KEYS = np.array([3, 1, 3, 8, 1, 3], dtype=np.int64)  # 3 distinct keys, repeated


def ftrl_pow(n, p):
    return n ** (-p)


def model_step(opt, w, s, g, step, t):
    """One update of rows w (k, DIM), slots s, summed grads g, in float64."""
    if isinstance(opt, evdb.optim.SGD):
        w = w - opt.lr * (g + opt.weight_decay * w)
        norm = np.linalg.norm(w, axis=1, keepdims=True)
        return w * np.maximum(0, 1 - opt.lr * opt.group_lasso / norm), s
    if isinstance(opt, evdb.optim.Adagrad):
        g = g + opt.weight_decay * w
        s = s + g * g
        w = w - opt.lr * g / (np.sqrt(s) + opt.eps)
        norm = np.linalg.norm(w, axis=1, keepdims=True)
        return w * np.maximum(0, 1 - opt.lr * opt.group_lasso / norm), s
    if isinstance(opt, evdb.optim.Adam):
        m = opt.beta1 * s[:, :DIM] + (1 - opt.beta1) * g
        v = opt.beta2 * s[:, DIM:] + (1 - opt.beta2) * g * g
        step_size = opt.lr * np.sqrt(1 - opt.beta2**t) / (1 - opt.beta1**t)
        return w - step_size * m / (np.sqrt(v) + opt.eps), np.hstack([m, v])
    if isinstance(opt, evdb.optim.Ftrl):  # and GroupFtrl
        n, z = s[:, :DIM], s[:, DIM:]
        n2 = n + g * g
        z = z + g - (ftrl_pow(n2, opt.lr_power) - ftrl_pow(n, opt.lr_power)) / opt.lr * w
        quad = ftrl_pow(n2, opt.lr_power) / opt.lr + 2 * opt.l2
        if isinstance(opt, evdb.optim.GroupFtrl):
            zn = np.linalg.norm(z, axis=1, keepdims=True)
            w = np.where(zn > opt.l1, (opt.l1 * z / zn - z) / quad, 0.0)
        else:
            w = np.where(np.abs(z) > opt.l1, (np.sign(z) * opt.l1 - z) / quad, 0.0)
        return w, np.hstack([n2, z])
    if isinstance(opt, evdb.optim.AdagradDecay):
        if (step + 1) % opt.decay_steps == 0:
            s = np.maximum(s * opt.decay_rate, opt.initial_accumulator)
        s = s + g * g
        return w - opt.lr * g / np.sqrt(s), s
    if isinstance(opt, evdb.optim.RowWiseAdagrad):
        s = s + (g * g).mean(axis=1, keepdims=True)
        return w - opt.lr * g / (np.sqrt(s) + opt.eps), s
    raise AssertionError(opt)


def initial_slots(opt, k):
    if isinstance(opt, (evdb.optim.Adagrad, evdb.optim.AdagradDecay)):
        return np.full((k, DIM), opt.initial_accumulator)
    if isinstance(opt, evdb.optim.Adam):
        return np.zeros((k, 2 * DIM))
    if isinstance(opt, evdb.optim.Ftrl):
        return np.hstack([np.full((k, DIM), opt.initial_accumulator), np.zeros((k, DIM))])
    if isinstance(opt, evdb.optim.RowWiseAdagrad):
        return np.zeros((k, 1))
    return np.zeros((k, 0))


OPTIMIZERS = [
    evdb.optim.SGD(lr=0.1),
    evdb.optim.SGD(lr=0.1, weight_decay=0.01, group_lasso=0.05),
    evdb.optim.Adagrad(lr=0.1, initial_accumulator=0.1, eps=1e-10),
    evdb.optim.Adagrad(lr=0.1, weight_decay=0.02, group_lasso=0.1),
    evdb.optim.Adam(lr=0.05),
    evdb.optim.Ftrl(lr=0.1, l1=0.01, l2=0.1),
    evdb.optim.Ftrl(lr=0.1, lr_power=-0.3, l1=0.0, l2=0.0),
    evdb.optim.GroupFtrl(lr=0.1, l1=0.05, l2=0.1),
    evdb.optim.AdagradDecay(lr=0.1, decay_steps=2, decay_rate=0.5),
    evdb.optim.RowWiseAdagrad(lr=0.1, eps=1e-8),
]


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=repr)
@pytest.mark.parametrize("per_position", [False, True])
def test_push_follows_the_rule_over_several_steps(db, opt, per_position) -> None:
    t = db.create_table("t", dim=DIM, optimizer=opt, initializer=evdb.init.Zeros())
    rng = np.random.default_rng(7)
    start = rng.standard_normal((3, DIM))
    uniq = np.array([3, 1, 8], dtype=np.int64)
    t.upsert(uniq, start)
    w, s = start.copy(), initial_slots(opt, 3)
    for step in range(STEPS):
        p = t.pull(KEYS)
        assert p.keys.tolist() == uniq.tolist()
        if per_position:
            grads = rng.standard_normal((KEYS.shape[0], DIM)).astype(np.float32)
            g = np.zeros((3, DIM))
            np.add.at(g, p.inverse, grads.astype(np.float64))
        else:
            grads = rng.standard_normal((3, DIM)).astype(np.float32)
            g = grads.astype(np.float64)
        t.push(p, grads, per_position=per_position)
        w, s = model_step(opt, w, s, g, db.step, step + 1)
        db.advance()
    np.testing.assert_allclose(t.lookup(uniq), w, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(t.read_records(uniq)[1].slots, s, rtol=2e-5, atol=2e-6)


def test_group_lasso_zeroes_whole_rows_and_compact_drops_them(db) -> None:
    t = db.create_table(
        "t",
        dim=3,
        optimizer=evdb.optim.SGD(lr=1.0, group_lasso=1.0),
        l2_threshold=1e-6,
        initializer=evdb.init.Zeros(),
    )
    t.upsert([1, 2], [[0.3, 0.3, 0.3], [5.0, 5.0, 5.0]])
    p = t.pull([1, 2])
    t.push(p, np.zeros((2, 3)))
    assert t.lookup([1]).tolist() == [[0.0, 0.0, 0.0]]  # |w| = 0.52 < lr * lasso: exactly 0
    assert (t.lookup([2]) > 0).all()
    assert t.compact()["l2"] == 1 and t.contains([1, 2]).tolist() == [False, True]


def test_group_ftrl_zeroes_whole_rows(db) -> None:
    t = db.create_table("t", dim=3, optimizer=evdb.optim.GroupFtrl(lr=0.1, l1=10.0))
    p = t.pull([1])
    t.push(p, np.full((1, 3), 0.5))
    assert t.lookup([1]).tolist() == [[0.0, 0.0, 0.0]]


def test_adam_counts_pushes_for_bias_correction(db) -> None:
    # The first push moves each element by about lr (m / sqrt(v) = sign(g) after correction).
    t = db.create_table(
        "t", dim=2, optimizer=evdb.optim.Adam(lr=0.01), initializer=evdb.init.Zeros()
    )
    p = t.pull([1])
    t.push(p, [[3.0, -0.5]])
    np.testing.assert_allclose(t.lookup([1]), [[-0.01, 0.01]], rtol=1e-5)
    assert t.stats()["pushes"] == 1


def test_upsert_keeps_slots_of_existing_rows_and_new_rows_start_fresh(db) -> None:
    opt = evdb.optim.Adagrad(lr=0.1, initial_accumulator=0.1)
    t = db.create_table("t", dim=2, optimizer=opt, ttl_steps=2)
    p = t.pull([1, 2])
    t.push(p, np.ones((2, 2)))
    t.upsert([1], [[5.0, 5.0]])
    np.testing.assert_allclose(t.read_records([1, 2])[1].slots, 1.1)  # kept: 0.1 + 1^2
    t.delete([2])
    t.upsert([2], [[1.0, 1.0]])
    np.testing.assert_allclose(t.read_records(np.array([2]))[1].slots, 0.1)  # fresh
    db.advance(3)  # key 1 expires
    t.upsert([1], [[1.0, 1.0]])
    np.testing.assert_allclose(t.read_records(np.array([1]))[1].slots, 0.1)  # fresh


def test_slots_survive_reopen(tmp_path: Path) -> None:
    with evdb.open(tmp_path) as db:
        t = db.create_table("t", dim=2, optimizer=evdb.optim.Adam(lr=0.1))
        p = t.pull([1, 2])
        t.push(p, [[1.0, 2.0], [3.0, 4.0]])
        slots = t.read_records([1, 2])[1].slots
    with evdb.open(tmp_path) as db:
        t = db.table("t")
        assert t.config.optimizer == evdb.optim.Adam(lr=0.1)
        np.testing.assert_array_equal(t.read_records([1, 2])[1].slots, slots)
        p = t.pull([1])
        t.push(p, [[1.0, 1.0]])
        assert t.stats()["pushes"] == 2  # Adam's t continues after the reopen


def test_non_finite_gradients_change_no_row_and_no_slot(db) -> None:
    t = db.create_table("t", dim=2, optimizer=evdb.optim.Adagrad(lr=0.1))
    p = t.pull([1, 2, 1])
    before = t.read_records([1, 2])[1]
    with pytest.raises(ValueError, match=r"grads\[2, 1\] = nan"):
        t.push(p, [[1.0, 1.0], [1.0, 1.0], [1.0, np.nan]], per_position=True)
    after = t.read_records([1, 2])[1]
    np.testing.assert_array_equal(after.values, before.values)
    np.testing.assert_array_equal(after.slots, before.slots)
    assert t.stats()["pushes"] == 0


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: evdb.optim.SGD(lr=0), r"SGD.lr must be a finite number in \(0.0"),
        (lambda: evdb.optim.Adagrad(initial_accumulator=0.0, eps=0.0), "0/0"),
        (lambda: evdb.optim.Adam(beta1=1.0), "Adam.beta1"),
        (lambda: evdb.optim.Ftrl(lr_power=0.5), "Ftrl.lr_power"),
        (lambda: evdb.optim.GroupFtrl(l1=-1.0), "GroupFtrl.l1"),
        (lambda: evdb.optim.AdagradDecay(decay_steps=0), "decay_steps must be an int >= 1"),
        (lambda: evdb.optim.RowWiseAdagrad(eps=0.0), "RowWiseAdagrad.eps"),
        (lambda: evdb.optim.from_dict({"kind": "lamb"}), "unknown kind 'lamb'"),
    ],
)
def test_bad_optimizer_config_is_rejected(make, message) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=repr)
def test_optimizer_config_round_trips(opt) -> None:
    assert evdb.optim.from_dict(opt.to_dict()) == opt


def test_learning_rate_can_change_between_pushes_and_is_kept(tmp_path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table(
            "t", dim=1, optimizer=evdb.optim.SGD(lr=0.1), initializer=evdb.init.Zeros()
        )
        p = t.pull([1])
        t.push(p, [[1.0]])
        t.learning_rate = 0.5
        p = t.pull([1])
        t.push(p, [[1.0]])
        np.testing.assert_allclose(t.lookup([1]), [[-0.6]], rtol=1e-6)
        assert t.learning_rate == 0.5 and t.config.optimizer.lr == 0.5  # the config shows it
        with pytest.raises(ConfigError, match=r"SGD\.lr"):
            t.learning_rate = -1.0
        assert t.learning_rate == 0.5
    with evdb.open(tmp_path / "db") as db:  # a reopen resumes with the rate last set
        t = db.table("t")
        assert t.learning_rate == 0.5 and t.config.optimizer == evdb.optim.SGD(lr=0.5)
        t.push(t.pull([1]), [[1.0]])
        np.testing.assert_allclose(t.lookup([1]), [[-1.1]], rtol=1e-6)
