"""The HBM tier on a CUDA device, run on the cupy stand-in (tests/cuda_cpu): the cache-tier
contract with cupy columns, the size check against the device's free memory, the device
count, device placement, and transfers batched through a reused pinned buffer.

The kernels are ``backend("gpu")``'s, the CUDA sources built and run on the CPU by
``tests.cuda_cpu.rawmodule`` (on a GPU with ``EVDB_REAL_CUPY=1``; tests of the stand-in's
controls then skip); ``EVDB_DEVICE_KERNELS=cuda,numba`` adds a run on the cpu kernels behind
the device arrays (``tests.cuda_cpu.adapter``)."""

from __future__ import annotations

import numpy as np
import pytest

import evdb
from evdb.config import DramConfig, HbmConfig
from evdb.errors import ConfigError
from evdb.tiers.base import CacheTier
from evdb.tiers.hbm import DeviceCache, device_bytes, hbm_tier
from tests.cuda_cpu.cupy_standin._state import STATE
from tests.cuda_cpu.device_kernels import KERNEL_SETS, require_standin, use_kernels

from .cache_contract import CacheContract, Factory
from .contract import DIM, SLOTS, records


@pytest.fixture(params=KERNEL_SETS)
def on_standin(request: pytest.FixtureRequest, standin_cupy, monkeypatch: pytest.MonkeyPatch):
    """cupy (the stand-in, or EVDB_REAL_CUPY=1's), with the tier's kernels (KERNEL_SETS)."""
    use_kernels(request.param, standin_cupy, monkeypatch)
    return standin_cupy


def device_tier(capacity_rows: int = 10_000, device: int = 0) -> DeviceCache:
    tier = hbm_tier(DIM, SLOTS, HbmConfig(capacity_rows=capacity_rows, device=device), DramConfig())
    assert isinstance(tier, DeviceCache)
    return tier


class TestDeviceHbmTier(CacheContract):
    @pytest.fixture
    def make(self, on_standin) -> Factory:
        return device_tier

    @pytest.fixture
    def cache(self, make: Factory) -> CacheTier:
        return make()


def test_columns_and_index_live_on_the_device_and_stats_say_which(on_standin) -> None:
    cp = on_standin
    require_standin(cp)
    cp.cuda.runtime.set_device_count(2)
    tier = device_tier(device=1)
    tier.put(np.arange(5, dtype=np.int64), records(5))
    for column in (tier.values, tier.slots, tier.freq, tier.is_live, tier.index.slots):
        assert isinstance(column, cp.ndarray) and column.device.id == 1
    s = tier.stats()
    assert s["device"] == "cuda:1" and s["emulated"] is False and s["rows"] == 5
    assert s["device_total_bytes"] == cp.cuda.runtime.memGetInfo()[1]
    assert cp.cuda.runtime.getDevice() == 0  # the tier left the current device alone


def test_a_promotion_is_a_few_copies_through_one_reused_pinned_buffer(on_standin) -> None:
    cp = on_standin
    require_standin(cp)
    tier = device_tier()
    tier.put(np.arange(10, dtype=np.int64), records(10))
    allocations = STATE.pinned_allocations
    copies = []
    for i, n in enumerate((1000, 10, 1000)):  # new rows per batch: copies do not grow with n
        before = cp.transfers()
        keys = np.arange(n, dtype=np.int64) + 10_000 * (i + 1)
        tier.put(keys, records(n))  # a locate, then an insert of every column
        found, back = tier.get(keys)
        after = cp.transfers()
        assert found.all() and back.values.shape == (n, DIM)
        copies.append({d: after[d] - before[d] for d in after})
    assert copies[0] == copies[1] == copies[2]
    assert copies[0]["to_device"] <= 12 and copies[0]["to_host"] <= 8
    assert STATE.pinned_allocations - allocations <= 1  # grown once for 1000 rows, reused


def test_a_tier_bigger_than_the_free_memory_is_refused_with_both_numbers(on_standin) -> None:
    cp = on_standin
    require_standin(cp)
    need = device_bytes(DIM, SLOTS, 1000)
    cp.cuda.runtime.set_mem_info(need - 1, 10 * need)
    with pytest.raises(ConfigError, match=rf"needs {need} bytes.* {need - 1} bytes free \(of "):
        device_tier(capacity_rows=1000)
    cp.cuda.runtime.set_mem_info(need, 10 * need)
    assert device_tier(capacity_rows=1000).capacity_rows == 1000  # exactly enough fits


def test_device_bytes_count_every_column_and_the_index() -> None:
    tier = hbm_tier(DIM, SLOTS, HbmConfig(capacity_rows=2048, device="cpu"), DramConfig())
    tier.put(np.arange(2048, dtype=np.int64), records(2048))
    assert tier.stats()["bytes"] == device_bytes(DIM, SLOTS, 2048)


def test_a_device_that_is_not_there_is_refused_and_the_database_keeps_nothing(
    standin_cupy, tmp_path
) -> None:
    require_standin(standin_cupy)
    with evdb.open(tmp_path / "db") as db:
        with pytest.raises(ConfigError, match=r"device=1: .*cupy sees 1 CUDA device"):
            db.create_table("t", dim=DIM, hbm_rows=8, device=1)
        standin_cupy.cuda.runtime.set_device_count(0)
        with pytest.raises(ConfigError, match=r"device=0: .*no CUDA device.*device='cpu'"):
            db.create_table("t", dim=DIM, hbm_rows=8, device=0)
        assert db.tables() == []


def test_a_device_table_reopens_only_where_the_device_is(on_standin, tmp_path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=DIM, hbm_rows=8, device=0, dram_rows=None, disk=False)
        t.upsert(np.arange(20), np.ones((20, DIM), np.float32))
        assert t.stats()["tiers"]["hbm"]["device"] == "cuda:0"
    with evdb.open(tmp_path / "db") as db:
        assert len(db.table("t")) == 20
    require_standin(on_standin)
    on_standin.cuda.runtime.set_device_count(0)
    with pytest.raises(ConfigError, match="no CUDA device"):
        evdb.open(tmp_path / "db")


def test_a_missing_transfer_fails_instead_of_passing_silently(on_standin) -> None:
    require_standin(on_standin)
    tier = device_tier()
    tier._dev = lambda a: a  # host arrays straight into the device columns and kernels
    with pytest.raises(TypeError, match=r"cupy array|numpy"):
        tier.put(np.arange(3, dtype=np.int64), records(3))
    tier = device_tier()
    tier.put(np.arange(3, dtype=np.int64), records(3))
    tier._host = lambda a: a  # device arrays handed to the table as if they were host ones
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(tier.locate(np.arange(3, dtype=np.int64)))


def test_the_device_index_grows_by_moving_a_part_per_call(
    on_standin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("evdb.hashindex.MOVE_SLOTS", 256)  # spread moves at CPU sizes
    tier = device_tier(capacity_rows=10)  # sized for 10 keys: it has to grow
    keys = np.random.default_rng(5).permutation(4000).astype(np.int64) * 13 - 7000
    moved_while_growing = False
    for start in range(0, 4000, 400):
        tier.put(keys[start : start + 400], records(400, seed=start))
        moved_while_growing |= tier.index_moving
        np.testing.assert_array_equal(tier.locate(keys[: start + 400]) >= 0, True)
    assert moved_while_growing and len(tier) == 4000
    gone = keys[::3]
    assert tier.remove(gone).all() and len(tier) == 4000 - gone.shape[0]
    assert (tier.locate(gone) == -1).all() and (tier.locate(keys[1::3]) >= 0).all()
