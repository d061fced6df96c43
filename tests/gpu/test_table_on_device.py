"""A table whose HBM tier is on CUDA device 0, run on the cupy stand-in (tests/cuda_cpu):
the table's state machine over HBM -> DRAM -> RocksDB (and HBM over DRAM without a disk), and
the torch binding training through it as through torch.nn.EmbeddingBag.

The kernels are ``backend("gpu")``'s: the real CUDA sources, built and run on the CPU
(``tests.cuda_cpu.rawmodule``; fewer state-machine examples than the emulated-HBM machines of
test_table_stateful: every launch runs its threads as OS threads), or on a GPU with
``EVDB_REAL_CUPY=1``. ``EVDB_DEVICE_KERNELS=cuda,numba`` adds the cpu kernels behind the
device arrays (``tests.cuda_cpu.adapter``). The table suite on device 0 is in
tests/tiers/test_table_with_hbm.py and tests/tiers/test_hbm_device.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

import evdb
from tests.cuda_cpu.device_kernels import KERNEL_SETS, use_kernels

from ..test_table_stateful import HbmOverDramTable, HbmTable

# Examples and steps per machine: the emulated-HBM machines of test_table_stateful run the
# default 60 x 40; here the CUDA executor runs every launch's threads as OS threads.
CUDA_EXAMPLES, CUDA_STEPS = 10, 30
NUMBA_EXAMPLES = (10, 30)


@pytest.fixture(params=KERNEL_SETS)
def kernels(request: pytest.FixtureRequest, standin_cupy, monkeypatch: pytest.MonkeyPatch) -> str:
    use_kernels(request.param, standin_cupy, monkeypatch)
    return str(request.param)


class DeviceHbmTable(HbmTable):
    """HbmTable's machine with the HBM tier on device 0."""

    def tiers(self) -> dict:
        return {**super().tiers(), "device": 0}

    def every_level_within_its_rows(self) -> None:
        super().every_level_within_its_rows()
        assert self.t.stats()["tiers"]["hbm"]["device"] == "cuda:0"


class DeviceHbmOverDramTable(HbmOverDramTable):
    def tiers(self) -> dict:
        return {**super().tiers(), "device": 0}


def _run(machine: type, kernels: str) -> None:
    examples, steps = (CUDA_EXAMPLES, CUDA_STEPS) if kernels == "cuda" else NUMBA_EXAMPLES
    run_state_machine_as_test(
        machine, settings=settings(max_examples=examples, stateful_step_count=steps)
    )


@pytest.mark.parametrize("machine", [DeviceHbmTable, DeviceHbmOverDramTable])
def test_the_table_state_machine_holds_with_hbm_on_device_0(kernels: str, machine) -> None:
    _run(machine, kernels)


def test_the_torch_binding_trains_through_a_device_tier_as_torch_does(kernels, tmp_path) -> None:
    torch = pytest.importorskip("torch")
    from evdb.torch import EmbeddingBag

    vocab, dim, batch = 30, 4, 8
    rng = np.random.default_rng(0)
    start = (rng.standard_normal((vocab, dim)) * 0.3).astype(np.float32)
    ref = torch.nn.EmbeddingBag(vocab, dim, mode="mean", sparse=True)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(start))
    ref_opt = torch.optim.Adagrad([ref.weight], lr=0.3, initial_accumulator_value=0.1, eps=1e-10)
    with evdb.open(tmp_path / "db") as db:
        rule = evdb.optim.Adagrad(lr=0.3, initial_accumulator=0.1, eps=1e-10)
        t = db.create_table("t", dim=dim, optimizer=rule, hbm_rows=6, device=0, dram_rows=10)
        t.upsert(np.arange(vocab), start)
        emb = EmbeddingBag(t, mode="mean")
        for _ in range(12):
            lens = rng.integers(1, 4, batch)
            keys = torch.from_numpy(rng.integers(0, vocab, int(lens.sum())))
            offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lens)[:-1]]))
            target = torch.from_numpy(rng.standard_normal((batch, dim)).astype(np.float32))
            losses = []
            for module, opt in ((ref, ref_opt), (emb, None)):
                loss = ((module(keys, offsets) - target) ** 2).sum()
                if opt is not None:
                    opt.zero_grad()
                loss.backward()
                if opt is not None:
                    opt.step()
                losses.append(loss.item())
            db.advance()
            assert abs(losses[0] - losses[1]) < 1e-4 * max(1.0, abs(losses[0]))
        tiers = t.stats()["tiers"]
        assert tiers["hbm"]["device"] == "cuda:0" and tiers["hbm"]["promotions"] > 0
        np.testing.assert_allclose(
            t.lookup(np.arange(vocab)), ref.weight.detach().numpy(), rtol=1e-4, atol=1e-5
        )
