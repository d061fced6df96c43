"""The same training run on torch.nn.EmbeddingBag(sparse=True) + a torch optimizer and on an
evdb table (rows upserted with the same start values): after 20 steps the tables agree."""

from __future__ import annotations

import numpy as np
import pytest

import evdb

torch = pytest.importorskip("torch")

VOCAB, DIM, BAGS, STEPS = 50, 8, 16, 20


def batches(seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(STEPS):
        lengths = rng.integers(0, 5, BAGS)  # empty bags included
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        idx = rng.integers(0, VOCAB, int(lengths.sum())).astype(np.int64)
        target = rng.standard_normal((BAGS, DIM)).astype(np.float32)
        yield idx, offsets, target


CASES = [
    ("sgd", lambda p: torch.optim.SGD(p, lr=0.1), evdb.optim.SGD(lr=0.1)),
    (
        "adagrad",
        lambda p: torch.optim.Adagrad(p, lr=0.1, initial_accumulator_value=0.1, eps=1e-10),
        evdb.optim.Adagrad(lr=0.1, initial_accumulator=0.1, eps=1e-10),
    ),
    (
        "sparse_adam",
        lambda p: torch.optim.SparseAdam(p, lr=0.05, betas=(0.9, 0.999), eps=1e-8),
        evdb.optim.Adam(lr=0.05, beta1=0.9, beta2=0.999, eps=1e-8),
    ),
]


@pytest.mark.parametrize("name,torch_opt,evdb_opt", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_evdb_trains_like_torch_embedding_bag(db, name, torch_opt, evdb_opt, mode) -> None:
    rng = np.random.default_rng(0)
    start = rng.standard_normal((VOCAB, DIM)).astype(np.float32)
    emb = torch.nn.EmbeddingBag(VOCAB, DIM, mode=mode, sparse=True)
    with torch.no_grad():
        emb.weight.copy_(torch.from_numpy(start))
    opt = torch_opt(emb.parameters())
    t = db.create_table("t", dim=DIM, optimizer=evdb_opt)
    t.upsert(np.arange(VOCAB), start)

    for idx, offsets, target in batches(seed=1):
        # torch: loss = 0.5 * |out - target|^2, so d loss / d out = out - target
        out = emb(torch.from_numpy(idx), torch.from_numpy(offsets))
        loss = 0.5 * ((out - torch.from_numpy(target)) ** 2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        # evdb: the same, with the rows pulled, combined, and the gradient pushed
        p = t.pull(idx)
        combined = p.combine(offsets, combiner=mode)
        grads = p.combine_backward(combined - target, offsets, combiner=mode)
        t.push(p, grads)
        db.advance()

    np.testing.assert_allclose(
        t.lookup(np.arange(VOCAB)), emb.weight.detach().numpy(), rtol=1e-5, atol=1e-5
    )
    assert not np.allclose(t.lookup(np.arange(VOCAB)), start)  # it trained
