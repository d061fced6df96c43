"""The stand-in's process state: the current device, the visible devices, each device's
free and total memory (settable, so a test can make a tier too big for its device), and
counters of transfers and pinned allocations (so a test can see that a batch crossed in a
few copies, not one per row)."""

from __future__ import annotations

import dataclasses

__all__ = ["STATE", "count_transfer", "current_device", "reset"]

_GIB = 1 << 30


@dataclasses.dataclass
class State:
    device_count: int = 1
    device_stack: list[int] = dataclasses.field(default_factory=lambda: [0])
    mem_free: int = 64 * _GIB
    mem_total: int = 80 * _GIB
    transfers: dict[str, int] = dataclasses.field(
        default_factory=lambda: {"to_device": 0, "to_host": 0}
    )
    transfer_bytes: dict[str, int] = dataclasses.field(
        default_factory=lambda: {"to_device": 0, "to_host": 0}
    )
    pinned_allocations: int = 0


STATE = State()


def reset() -> None:
    """Back to one device of 80 GiB (64 free), device 0 current, counters at zero."""
    fresh = State()
    for field in dataclasses.fields(State):
        setattr(STATE, field.name, getattr(fresh, field.name))


def current_device() -> int:
    return STATE.device_stack[-1]


def count_transfer(direction: str, nbytes: int) -> None:
    STATE.transfers[direction] += 1
    STATE.transfer_bytes[direction] += int(nbytes)
