"""The HBM tier: the hottest rows, on top of the chain (HBM over DRAM over RocksDB).

It keeps the contract the ``Table``'s hot paths use on the top tier (``DramTier``'s: column
slabs found through a hash index, pinning of the batch in flight, victims by score) and takes
DRAM's place at the top of the chain, with DRAM (and RocksDB under it) as its backing tier
(``evdb.tiers.chain.ChainTier``)::

    TierChain(HbmTier, ChainTier(TierChain(DramTier, RocksTier)))

``device="cpu"``: **emulated HBM**, the HBM caching logic on the CPU, for tests. The rows live
in numpy columns and the cpu kernels run on them, exactly as in the DRAM tier; what the
emulation exercises is everything above the storage: promotion from DRAM or RocksDB into a
bounded top tier, write-back of dirty victims into DRAM, pinning (a batch larger than the tier
over-commits it until its push), exact ``len`` across three levels, flush through every level,
reopen and checkpoints. CI runs the table's tests with it.

``device=N`` (a CUDA device): not available yet. The table's ``lookup``/``pull``/``push`` run
numpy and numba code on the top tier's columns in place; columns held by cupy need those paths
to call ``evdb.kernels.backend("gpu")`` instead, which this tier does not do yet. Creating one
raises ``ConfigError`` saying which is missing: cupy, a CUDA device, or the GPU path itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from evdb.config import DramConfig, HbmConfig, HbmDevice
from evdb.errors import ConfigError
from evdb.tiers.dram import DramTier

__all__ = ["HbmTier", "require_device"]

_EMULATED = "cpu"


def require_device(device: HbmDevice) -> None:
    """Raise ``ConfigError`` unless an HBM tier can live on ``device`` in this process.

    ``"cpu"`` (emulated HBM) always can. A CUDA device needs cupy and a visible device (checked
    lazily: cupy is imported here, never when evdb is), and then the GPU path, which is not
    built yet.
    """
    if device == _EMULATED:
        return
    from evdb.kernels import gpu  # imports no cupy until require() runs

    advice = "use device='cpu' for the emulated HBM tier (tests), or no hbm_rows"
    try:
        gpu.require()
    except ConfigError as exc:
        raise ConfigError(
            f"device={device!r}: cannot create an HBM tier here: {exc}; {advice}"
        ) from exc
    raise ConfigError(
        f"device={device!r}: the HBM tier on a GPU is not available yet (cupy and a CUDA device "
        "are present, but the table's lookup/pull/push still run CPU code on the top tier's "
        f"columns); {advice}"
    )


class HbmTier(DramTier):
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

    name = "hbm"

    def __init__(self, dim: int, n_slots: int, config: HbmConfig, policy: DramConfig) -> None:
        require_device(config.device)
        super().__init__(
            dim,
            n_slots,
            dataclasses.replace(policy, capacity_rows=config.capacity_rows, initial_rows=0),
        )
        self.hbm = config

    @property
    def device(self) -> str:
        return "cpu" if self.hbm.device == _EMULATED else f"cuda:{self.hbm.device}"

    @property
    def is_emulated(self) -> bool:
        """True when the HBM tier runs on the CPU (``device="cpu"``)."""
        return self.hbm.device == _EMULATED

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "device": self.device, "emulated": self.is_emulated}
