"""The HBM tier: the hottest rows, on top of the chain (HBM over DRAM over RocksDB).

It is the cache tier (``evdb.tiers.cache.ColumnCache``, the ``CacheTier`` role) under the
name "hbm", and takes DRAM's place at the top of the chain, with DRAM (and RocksDB under it)
as its backing tier (``evdb.tiers.chain.ChainTier``)::

    TierChain(hbm, ChainTier(TierChain(dram, rocks)))

``device="cpu"``: **emulated HBM**, the HBM caching logic on the CPU, for tests. The rows live
in numpy columns and the cpu kernels run on them, as in the DRAM tier; what the emulation
exercises is everything above the storage: promotion from DRAM or RocksDB into a
bounded top tier, write-back of dirty victims into DRAM, pinning (a batch larger than the tier
over-commits it until its push), exact ``len`` across three levels, flush through every level,
reopen and checkpoints. CI runs the table's tests with it.

``device=N`` (a CUDA device): the same ``ColumnCache`` over cupy arrays with the gpu kernels
(``evdb.kernels.backend("gpu")``); the table reaches the tier only through the ``CacheTier``
role, with host arrays crossing it. Until that path has run on a device, creating one raises
``ConfigError`` saying which is missing: cupy, a CUDA device, or the GPU path itself.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from evdb.config import DramConfig, HbmConfig, HbmDevice
from evdb.errors import ConfigError
from evdb.kernels import backend
from evdb.tiers.cache import ColumnCache

__all__ = ["hbm_tier", "require_device"]

_EMULATED = "cpu"


def require_device(device: HbmDevice) -> None:
    """Raise ``ConfigError`` unless an HBM tier can live on ``device`` in this process.

    ``"cpu"`` (emulated HBM) always can. A CUDA device needs cupy and a visible device (checked
    lazily: cupy is imported here, never when evdb is), and then the GPU path, which has not
    run on a device yet.
    """
    if device == _EMULATED:
        return
    advice = "use device='cpu' for the emulated HBM tier (tests), or no hbm_rows"
    try:
        backend("gpu")  # raises where cupy or a CUDA device is missing
    except ConfigError as exc:
        raise ConfigError(
            f"device={device!r}: cannot create an HBM tier here: {exc}; {advice}"
        ) from exc
    raise ConfigError(
        f"device={device!r}: the HBM tier on a GPU is not available yet (cupy and a CUDA device "
        "are present, but the cache tier's GPU path has never run on a device); " + advice
    )


def hbm_tier(dim: int, n_slots: int, config: HbmConfig, policy: DramConfig) -> ColumnCache:
    """The top tier of a table created with ``hbm_rows``: a bounded cache of the hot rows.

    Parameters
    ----------
    dim, n_slots : int
        Record width (values, optimizer slots).
    config : HbmConfig
        ``capacity_rows`` and ``device``; only ``device="cpu"`` (emulated) can be built today.
    policy : DramConfig
        The victim policy (``eviction``, ``half_life_steps``, ``evict_fraction``), shared with
        the DRAM tier; its ``capacity_rows`` is the DRAM tier's and is not used here.

    Raises
    ------
    ConfigError
        For a CUDA device (see ``require_device``).
    """
    require_device(config.device)
    return ColumnCache(
        dim,
        n_slots,
        dataclasses.replace(policy, capacity_rows=config.capacity_rows, initial_rows=0),
        name="hbm",
        device=_EMULATED,
        xp=np,
        kernels=backend("cpu"),
        emulated=True,
    )
