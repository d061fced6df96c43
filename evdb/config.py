"""Frozen, validated, I/O-free table configuration: one dataclass per concern.

A tier is present or absent (``TableConfig.hbm`` and ``TableConfig.disk`` are a config or None),
never switched on by a flag. "Off" and "forever" are spelled ``None``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from evdb import admission as _admission
from evdb import initializers as _init
from evdb import optim as _optim
from evdb.errors import ConfigError
from evdb.keys import KEY_TYPES, KeyType

__all__ = ["DiskConfig", "DramConfig", "HbmConfig", "TableConfig"]

Eviction = Literal["lfu", "lru"]
DiskDtype = Literal["float32", "float16", "bfloat16"]
Compression = Literal["lz4", "zstd", "none"]
HbmDevice = int | Literal["cpu"]
RowDtype = Literal["float32", "bfloat16", "float16"]
Rounding = Literal["stochastic", "nearest"]
ROUNDINGS = ("stochastic", "nearest")
ROW_DTYPES = ("float32", "bfloat16", "float16")  # the kernels' storage_dtype() choices
MAX_DIM = 65536


def parse_optional_int(name: str, value: Any, low: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int or None, got {value!r}")
    if value < low:
        raise ConfigError(f"{name} must be >= {low} or None, got {value}")
    return value


@dataclass(frozen=True)
class DramConfig:
    """The DRAM tier: a numpy row slab behind a numba hash index."""

    capacity_rows: int | None = None
    """Most rows the tier holds; None = unbounded (grows without a vocabulary size)."""
    eviction: Eviction = "lfu"
    """Victim score: "lfu" (pull count halved every ``half_life_steps``) or "lru" (last step)."""
    half_life_steps: int = 1000
    """LFU ageing: a row's frequency counts half after this many steps without a touch."""
    evict_fraction: float = 0.05
    """When full, evict down to (1 - evict_fraction) * capacity at once, to amortise the scan."""
    initial_rows: int = 0
    """Rows to make room for up front (TFRA's and HierarchicalKV's ``init_capacity``): a
    table expected to grow to about this size skips the slab copies and index rehashes on
    the way. Not a limit; costs the index's memory (16 bytes a slot) at once, the rows' only
    as they are written."""

    def __post_init__(self) -> None:
        parse_optional_int("dram.capacity_rows", self.capacity_rows, 1)
        if parse_optional_int("dram.initial_rows", self.initial_rows, 0) is None:
            raise ConfigError("dram.initial_rows must be an int >= 0, got None")
        if self.eviction not in ("lfu", "lru"):
            raise ConfigError(f"dram.eviction must be 'lfu' or 'lru', got {self.eviction!r}")
        parse_optional_int("dram.half_life_steps", self.half_life_steps, 1)
        if not isinstance(self.evict_fraction, float) or not 0.0 <= self.evict_fraction < 1.0:
            raise ConfigError(
                f"dram.evict_fraction must be a float in [0, 1), got {self.evict_fraction!r}"
            )


def parse_device(name: str, value: Any) -> HbmDevice:
    if value != "cpu" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigError(f"{name} must be a CUDA device number >= 0 or 'cpu', got {value!r}")
    return value  # type: ignore[no-any-return]


@dataclass(frozen=True)
class HbmConfig:
    """The HBM tier on top of the chain: a bounded cache of the hot rows over the DRAM tier
    (which then holds what HBM has no room for). Its victims are chosen by the DRAM tier's
    policy (``DramConfig.eviction``, ``half_life_steps``, ``evict_fraction``)."""

    capacity_rows: int
    """Most rows the tier holds (the batch in flight may exceed it until its push)."""
    device: HbmDevice = 0
    """The CUDA device the rows live on, or "cpu": emulated HBM, the HBM caching logic run on
    the CPU (numpy columns and the cpu kernels), for tests and CI without a GPU."""

    def __post_init__(self) -> None:
        if parse_optional_int("hbm.capacity_rows", self.capacity_rows, 1) is None:
            raise ConfigError("hbm.capacity_rows must be an int >= 1, got None")
        parse_device("hbm.device", self.device)

    def to_dict(self) -> dict[str, Any]:
        return {"capacity_rows": self.capacity_rows, "device": self.device}


def parse_hbm(hbm_rows: Any, device: Any, hbm: Any) -> HbmConfig | None:
    """The HBM tier ``create_table``'s flat arguments ask for (None: no HBM tier)."""
    if hbm is not None:
        if hbm_rows is not None or device is not None:
            raise ConfigError("pass hbm_rows (and device) or hbm=HbmConfig(...), not both")
        if not isinstance(hbm, HbmConfig):
            raise ConfigError(f"hbm must be an HbmConfig or None, got {hbm!r}")
        return hbm
    if hbm_rows is None:
        if device is not None:
            raise ConfigError(f"device={device!r} needs hbm_rows (the size of the HBM tier)")
        return None
    parse_optional_int("hbm_rows", hbm_rows, 1)
    if device is not None:
        parse_device("device", device)
    return HbmConfig(capacity_rows=hbm_rows, device=0 if device is None else device)


@dataclass(frozen=True)
class DiskConfig:
    """The RocksDB tier under DRAM: rows the DRAM tier has no room for live here."""

    dtype: DiskDtype = "float32"
    """How values are stored on disk. "float16" (or "bfloat16") halves the values' bytes
    (trained float32 rows barely compress) but rounds a float32 row each time it is written
    down (to nearest even): a lossy choice, so a row read back from disk may differ from the
    one written (optimizer slots stay float32; values beyond float16's range are counted in
    ``stats()``). A half-precision table (``TableConfig.dtype``) stores its own dtype, which
    loses nothing."""
    compression: Compression = "none"
    """RocksDB's block compression: "none", "lz4" or "zstd". Off by default: on trained
    float32 rows LZ4 saved 0.03% of the bytes and compacted 1.0-1.5x slower, ZSTD saved 5%
    and cut the write and cold-read rates by 30-40% (bench/bench_tiers.py, README
    "Performance"); rows that stay near a constant initial value (Zeros, Constant) do
    compress."""

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ConfigError(
                f"disk.dtype must be 'float32', 'float16' or 'bfloat16', got {self.dtype!r}"
            )
        if self.compression not in ("lz4", "zstd", "none"):
            raise ConfigError(
                f"disk.compression must be 'lz4', 'zstd' or 'none', got {self.compression!r}"
            )


@dataclass(frozen=True)
class TableConfig:
    """Everything that defines a table; persisted with the database."""

    dim: int
    """Embedding width, in [1, 65536]."""
    key_type: KeyType = "int64"
    """"int64", or "str" (keys hashed with xxh3-64 of their UTF-8 bytes)."""
    initializer: _init.Initializer = field(default_factory=lambda: _init.Normal(0.0, 0.01, 0))
    """Start value of a row, a pure function of (seed, key, column)."""
    admission: _admission.AdmissionPolicy = field(default_factory=_admission.AdmitAll)
    """Which pulled keys earn a row."""
    optimizer: _optim.Optimizer = field(default_factory=_optim.SGD)
    """The update ``push`` applies in place."""
    ttl_steps: int | None = None
    """Rows untouched for more than this many global steps expire; None = never."""
    l2_threshold: float | None = None
    """``compact()`` removes rows whose L2 norm is below this; None = never."""
    default_value: Literal["init"] | float = "init"
    """What a key without a row reads: "init" (its initializer value) or a constant."""
    dram: DramConfig = field(default_factory=DramConfig)
    """The DRAM tier."""
    keep_strings: bool = False
    """With ``key_type="str"``: store each row's original string (for word2vec exports);
    two strings that hash to the same key then raise ``KeyCollisionError`` instead of
    sharing a row. Costs a RocksDB multi-get of the batch's strings per pull."""
    disk: DiskConfig | None = field(default_factory=DiskConfig)
    """The RocksDB tier under DRAM; None = none (every row stays in DRAM, and a full DRAM
    tier drops rows; they still persist at flush)."""
    hbm: HbmConfig | None = None
    """The HBM tier on top of DRAM; None = none (DRAM is the top tier)."""
    dtype: RowDtype = "float32"
    """How the cache tiers store row values: "float32", "bfloat16" or "float16" (half the
    bytes; optimizer slots as ``slot_dtype``). Lookups and pulls still answer float32, and each
    push computes in float64 and rounds the result on write (``rounding``). Fixed for the
    table's life: changing it is ``evdb convert`` or an export/import round trip. Its disk
    tier stores the same dtype (a default ``DiskConfig`` is given it), and so does an HBM
    tier (on a CUDA device or emulated)."""
    rounding: Rounding = "stochastic"
    """How a half-precision row is rounded when a push writes it: "stochastic" (unbiased:
    an update smaller than half a unit in the last place still moves the row on average;
    the random bits are a function of (initializer seed, key, step, column), so runs
    repeat) or "nearest" (to nearest even: such updates are lost). Upserts, imports and
    new rows always round to nearest."""
    slot_dtype: RowDtype = "float32"
    """How every tier stores the optimizer's slots: "float32", or the table's own half
    ``dtype`` (half the slots' bytes: Adagrad's dim accumulators, Adam's 2 dim moments). Each
    push widens them, updates in float64 and rounds them as it rounds the row (``rounding``;
    their random bits are columns dim.. of the row's). Half slots on float32 values, or in
    the other half format, are not supported. Fixed for the table's life (``evdb convert``
    changes it offline)."""

    def __post_init__(self) -> None:
        if (
            isinstance(self.dim, bool)
            or not isinstance(self.dim, int)
            or not 1 <= self.dim <= MAX_DIM
        ):
            raise ConfigError(f"dim must be an int in [1, {MAX_DIM}], got {self.dim!r}")
        if self.key_type not in KEY_TYPES:
            raise ConfigError(f"key_type must be one of {KEY_TYPES}, got {self.key_type!r}")
        for name, kind in (
            ("initializer", _init.Initializer),
            ("admission", _admission.AdmissionPolicy),
            ("optimizer", _optim.Optimizer),
            ("dram", DramConfig),
        ):
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise ConfigError(f"{name} must be a {kind.__name__}, got {value!r}")
        if self.disk is not None and not isinstance(self.disk, DiskConfig):
            raise ConfigError(f"disk must be a DiskConfig or None, got {self.disk!r}")
        if self.hbm is not None and not isinstance(self.hbm, HbmConfig):
            raise ConfigError(f"hbm must be an HbmConfig or None, got {self.hbm!r}")
        if self.hbm is not None and self.disk is None and self.dram.capacity_rows is not None:
            raise ConfigError(
                f"hbm with disk=None needs an unbounded DRAM tier (dram.capacity_rows=None, got "
                f"{self.dram.capacity_rows}): DRAM is then the bottom tier, and a bottom tier that "
                "drops rows would drop rows the HBM tier caches"
            )
        if not isinstance(self.keep_strings, bool):
            raise ConfigError(f"keep_strings must be a bool, got {self.keep_strings!r}")
        if self.keep_strings and self.key_type != "str":
            raise ConfigError("keep_strings=True needs key_type='str'")
        parse_optional_int("ttl_steps", self.ttl_steps, 0)
        if self.l2_threshold is not None and (
            isinstance(self.l2_threshold, bool)
            or not isinstance(self.l2_threshold, (int, float))
            or not math.isfinite(self.l2_threshold)
            or self.l2_threshold < 0
        ):
            raise ConfigError(
                f"l2_threshold must be a finite number >= 0 or None, got {self.l2_threshold!r}"
            )
        self._check_dtype()
        dv = self.default_value
        if dv != "init" and (
            isinstance(dv, bool) or not isinstance(dv, (int, float)) or not math.isfinite(dv)
        ):
            raise ConfigError(f"default_value must be 'init' or a finite number, got {dv!r}")

    def _check_dtype(self) -> None:
        if self.dtype not in ROW_DTYPES:
            raise ConfigError(f"dtype: expected one of {ROW_DTYPES}, got {self.dtype!r}")
        if self.rounding not in ROUNDINGS:
            raise ConfigError(f"rounding: expected one of {ROUNDINGS}, got {self.rounding!r}")
        self._check_slot_dtype()
        if self.dtype == "float32":
            return
        if not self.optimizer.half_precision:
            raise ConfigError(
                f"optimizer: {type(self.optimizer).__name__} has no half-precision update, so "
                f"a dtype={self.dtype!r} table cannot use it; use one of "
                f"{_optim.HALF_PRECISION_NAMES}, or dtype='float32'"
            )
        if self.disk is not None and self.disk.dtype != self.dtype:
            if self.disk.dtype != "float32":
                raise ConfigError(
                    f"disk.dtype={self.disk.dtype!r} on a dtype={self.dtype!r} table: its disk "
                    f"tier stores the table's rows as they are ({self.dtype!r})"
                )
            # The default disk tier stores the table's dtype: 2-byte values, never widened
            object.__setattr__(self, "disk", dataclasses.replace(self.disk, dtype=self.dtype))

    def _check_slot_dtype(self) -> None:
        if self.slot_dtype not in ROW_DTYPES:
            raise ConfigError(f"slot_dtype: expected one of {ROW_DTYPES}, got {self.slot_dtype!r}")
        if self.slot_dtype in ("float32", self.dtype):
            return
        raise ConfigError(
            f"slot_dtype={self.slot_dtype!r} on a dtype={self.dtype!r} table: slots are "
            f"stored as 'float32' or in the table's own dtype ({self.dtype!r}); half slots "
            "on float32 values, or in the other half format, are not supported"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "dim": self.dim,
            "key_type": self.key_type,
            "initializer": self.initializer.to_dict(),
            "admission": self.admission.to_dict(),
            "optimizer": self.optimizer.to_dict(),
            "ttl_steps": self.ttl_steps,
            "l2_threshold": self.l2_threshold,
            "default_value": self.default_value,
            "keep_strings": self.keep_strings,
            "dram": {
                "capacity_rows": self.dram.capacity_rows,
                "eviction": self.dram.eviction,
                "half_life_steps": self.dram.half_life_steps,
                "evict_fraction": self.dram.evict_fraction,
                "initial_rows": self.dram.initial_rows,
            },
            "disk": None
            if self.disk is None
            else {"dtype": self.disk.dtype, "compression": self.disk.compression},
            "hbm": None if self.hbm is None else self.hbm.to_dict(),
            "dtype": self.dtype,
            "rounding": self.rounding,
            "slot_dtype": self.slot_dtype,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TableConfig:
        return cls(
            dim=d["dim"],
            key_type=d["key_type"],
            initializer=_init.from_dict(d["initializer"]),
            admission=_admission.from_dict(d["admission"]),
            optimizer=_optim.from_dict(d["optimizer"]),
            ttl_steps=d["ttl_steps"],
            l2_threshold=d["l2_threshold"],
            default_value=d["default_value"],
            keep_strings=d.get("keep_strings", False),
            dram=DramConfig(**d["dram"]),
            disk=None if d["disk"] is None else DiskConfig(**d["disk"]),
            hbm=None if d.get("hbm") is None else HbmConfig(**d["hbm"]),  # absent before HBM
            dtype=d.get("dtype", "float32"),  # absent before half-precision rows
            rounding=d.get("rounding", "stochastic"),
            slot_dtype=d.get("slot_dtype", "float32"),  # absent before half-precision slots
        )
