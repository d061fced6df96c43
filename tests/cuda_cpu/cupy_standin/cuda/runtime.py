"""``cupy.cuda.runtime`` on the stand-in: the visible devices and their memory."""

from __future__ import annotations

from typing import Any

from tests.cuda_cpu.cupy_standin._state import STATE, current_device

__all__ = [
    "CUDARuntimeError",
    "getDevice",
    "getDeviceCount",
    "getDeviceProperties",
    "memGetInfo",
    "runtimeGetVersion",
    "set_device_count",
    "set_mem_info",
]


class CUDARuntimeError(RuntimeError):
    """What cupy raises for a failed runtime call (here: an invalid device ordinal)."""


def check_device(device_id: int) -> int:
    if not 0 <= int(device_id) < STATE.device_count:
        raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
    return int(device_id)


def getDeviceCount() -> int:
    return STATE.device_count


def getDevice() -> int:
    return current_device()


def memGetInfo() -> tuple[int, int]:
    """(free, total) bytes of the current device: what ``set_mem_info`` last set."""
    check_device(current_device())
    return STATE.mem_free, STATE.mem_total


def runtimeGetVersion() -> int:
    return 12080


def getDeviceProperties(device_id: int) -> dict[str, Any]:
    check_device(device_id)
    return {"name": b"evdb CPU stand-in", "totalGlobalMem": STATE.mem_total, "major": 9, "minor": 0}


def set_device_count(n: int) -> None:
    """Test control: how many devices are visible (0: none, as on a machine without a GPU)."""
    STATE.device_count = int(n)


def set_mem_info(free: int, total: int) -> None:
    """Test control: what ``memGetInfo`` answers."""
    STATE.mem_free, STATE.mem_total = int(free), int(total)
