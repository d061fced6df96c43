"""The torch binding's device placement: embeddings go to the device of the module's input
(``evdb.torch_autograd.on_device_of``), and the gradient comes back through the copy. CI has
CPU torch, so the "meta" device stands in for CUDA."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import evdb

torch = pytest.importorskip("torch")
from evdb.torch import EmbeddingBag  # noqa: E402
from evdb.torch_autograd import on_device_of  # noqa: E402


def test_embeddings_follow_the_input_device_and_gradients_come_back(db) -> None:
    t = db.create_table("t", dim=3, optimizer=evdb.optim.SGD(lr=1.0))
    t.upsert([1, 2], np.ones((2, 3), np.float32))
    emb = EmbeddingBag(t, mode="sum")
    keys, offsets = torch.tensor([1, 2]), torch.tensor([0, 1])
    out = emb(keys, offsets)
    assert on_device_of(out, keys) is out  # same device: no copy
    moved = on_device_of(out, torch.empty(0, device="meta"))
    assert moved.device.type == "meta" and moved.shape == out.shape and moved.requires_grad
    assert on_device_of(out, ["a", "b"]) is out  # a str table's keys carry no device
    out.sum().backward()  # the host graph is intact behind the copy
    np.testing.assert_array_equal(t.lookup([1, 2]), np.zeros((2, 3), np.float32))


def _logging(count: Any, log: list[int]) -> Any:
    """count_transfer, also appending each copy's bytes to log."""

    def logged(direction: str, nbytes: int) -> None:
        log.append(int(nbytes))
        count(direction, nbytes)

    return logged


def test_a_device_table_trains_through_dlpack_without_moving_rows(
    standin_cupy, tmp_path, monkeypatch
) -> None:
    """A table whose top tier is on device 0 and an input there (the stand-in's arrays are
    host memory, so CPU tensors are "there" in CI): keys, weights and gradients go in and
    embeddings come out through DLPack; forward + backward copy nothing row-sized, and the
    result and the update equal those of the same module over emulated HBM on the host."""
    from tests.cuda_cpu.cupy_standin import _state
    from tests.cuda_cpu.device_kernels import require_standin, use_kernels

    require_standin(standin_cupy)
    use_kernels("cuda", standin_cupy, monkeypatch)
    dim, rng = 16, np.random.default_rng(5)
    start = rng.standard_normal((40, dim)).astype(np.float32)
    keys = torch.from_numpy(rng.integers(0, 40, 24))
    offsets = torch.tensor([0, 6, 6, 15])
    weights = torch.from_numpy(rng.random(24).astype(np.float32)).requires_grad_()
    results = {}
    with evdb.open(tmp_path / "db") as db:
        for device in ("cpu", 0):
            t = db.create_table(f"t{device}", dim=dim, hbm_rows=64, device=device)
            t.upsert(np.arange(40), start)
            emb = EmbeddingBag(t, mode="sum")
            emb(keys, offsets, weights).sum().backward()  # rows into HBM (promotions)
            log: list[int] = []
            with monkeypatch.context() as m:
                m.setattr(_state, "count_transfer", _logging(_state.count_transfer, log))
                w = weights.detach().clone().requires_grad_()
                out = emb(keys, offsets, w)
                (out * torch.arange(float(dim))).sum().backward()
            results[device] = (out.detach().clone(), w.grad, t.lookup(np.arange(40)))
            if device == 0:
                assert log and max(log) <= 8 * keys.shape[0] < out.shape[0] * dim * 4 * 2
                assert t.stats()["tiers"]["hbm"]["key_bytes_to_host"] > 0
    for a, b in zip(results["cpu"], results[0], strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)


def test_the_device_path_is_taken_where_the_input_is_on_the_tables_device(standin_cupy, db) -> None:
    """By DLPack's device tag: the stand-in's arrays are host memory, so a CPU tensor is on
    its device (a real cupy's need a CUDA tensor of the tier's device); a meta tensor, a str
    table's keys, or a table whose top tier is on the host take the host path."""
    from evdb.torch_autograd import device_path_for

    on_device = db.create_table("d", dim=2, hbm_rows=8, device=0)
    on_host = db.create_table("h", dim=2, hbm_rows=8, device="cpu")
    keys = torch.tensor([1, 2])
    expected = on_device.device_path if getattr(standin_cupy, "STANDIN", False) else None
    assert device_path_for(on_device, keys) is expected
    assert device_path_for(on_device, keys.to("meta")) is None
    assert device_path_for(on_device, ["a"]) is None
    assert on_host.device_path is None and device_path_for(on_host, keys) is None


def test_a_collection_over_a_device_table_trains_as_over_emulated_hbm(
    standin_cupy, tmp_path, monkeypatch
) -> None:
    """EmbeddingBagCollection: two features sharing a device table (their keys concatenated
    on the host, uploaded once) and one of their own, trained as over emulated HBM."""
    from evdb.torch import EmbeddingBagCollection
    from tests.cuda_cpu.device_kernels import require_standin, use_kernels

    require_standin(standin_cupy)
    use_kernels("cuda", standin_cupy, monkeypatch)
    rng = np.random.default_rng(6)
    start = rng.standard_normal((30, 4)).astype(np.float32)
    feats = {
        name: (torch.from_numpy(rng.integers(0, 30, 9)), torch.tensor([0, 4, 4]))
        for name in ("x", "y", "z")
    }
    results = []
    with evdb.open(tmp_path / "db") as db:
        for device in ("cpu", 0):
            shared, own = (
                db.create_table(f"{name}{device}", dim=4, hbm_rows=32, device=device)
                for name in ("s", "o")
            )
            for t in (shared, own):
                t.upsert(np.arange(30), start)
            ebc = EmbeddingBagCollection({"x": shared, "y": shared, "z": own}, mode="mean")
            for _ in range(2):
                out = ebc(feats)
                sum((o * (i + 1)).sum() for i, o in enumerate(out.values())).backward()
            results.append([out[n].detach() for n in "xyz"] + [shared.lookup(np.arange(30))])
            if device == 0:
                assert shared.stats()["tiers"]["hbm"]["key_bytes_to_device"] > 0
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
