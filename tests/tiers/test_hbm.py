"""The HBM tier: the shared contract on the emulated device, and clear errors where a GPU
tier cannot be built (no cupy, no device). The tier on a device: test_hbm_device.py."""

from __future__ import annotations

import numpy as np
import pytest

from evdb.config import DramConfig, HbmConfig
from evdb.errors import ConfigError
from evdb.kernels import gpu
from evdb.tiers.base import CacheTier
from evdb.tiers.hbm import hbm_tier, require_device

from .cache_contract import CacheContract, Factory
from .contract import DIM, SLOTS, records
from .test_dram import evict


class TestEmulatedHbmTier(CacheContract):
    @pytest.fixture
    def make(self) -> Factory:
        return lambda capacity_rows=10_000: hbm_tier(
            DIM, SLOTS, HbmConfig(capacity_rows=capacity_rows, device="cpu"), DramConfig()
        )

    @pytest.fixture
    def cache(self, make: Factory) -> CacheTier:
        return make()


def test_the_emulated_tier_is_bounded_by_hbm_rows_and_uses_the_dram_policy() -> None:
    policy = DramConfig(capacity_rows=None, eviction="lru", evict_fraction=0.5)
    tier = hbm_tier(DIM, SLOTS, HbmConfig(capacity_rows=10, device="cpu"), policy)
    assert tier.capacity_rows == 10 and tier.config.eviction == "lru"
    assert tier.device == "cpu" and tier.name == "hbm"
    recs = records(12)
    recs.last_step[:] = np.arange(12)
    tier.put(np.arange(12, dtype=np.int64), recs)
    evict(tier, 20, -(2**63))
    assert tier.get(np.arange(12, dtype=np.int64))[0].nonzero()[0].tolist() == list(range(7, 12))
    s = tier.stats()
    assert s["device"] == "cpu" and s["emulated"] is True and s["evictions"] == 7


def test_a_cuda_device_without_cupy_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cupy() -> None:
        raise ConfigError("the gpu backend needs cupy: pip install evdb[gpu]")

    monkeypatch.setattr(gpu, "require", no_cupy)
    with pytest.raises(ConfigError, match=r"device=0: .*needs cupy.*device='cpu'"):
        hbm_tier(DIM, SLOTS, HbmConfig(capacity_rows=10, device=0), DramConfig())
    require_device("cpu")  # the emulation needs nothing


def test_a_cuda_device_that_is_missing_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_device() -> None:
        raise ConfigError("the gpu backend found no CUDA device")

    monkeypatch.setattr(gpu, "require", no_device)
    with pytest.raises(ConfigError, match=r"device=1: .*no CUDA device"):
        require_device(1)


def test_this_machine_reports_the_real_reason() -> None:
    try:
        gpu.require()
    except ConfigError as exc:
        with pytest.raises(ConfigError) as caught:
            require_device(0)
        assert str(exc) in str(caught.value)
    else:
        require_device(0)  # cupy and a device: the tier can be built (tests/tiers/test_hbm_device)
