"""The torch binding's device placement: embeddings go to the device of the module's input
(``evdb.torch_autograd.on_device_of``), and the gradient comes back through the copy. CI has
CPU torch, so the "meta" device stands in for CUDA."""

from __future__ import annotations

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
