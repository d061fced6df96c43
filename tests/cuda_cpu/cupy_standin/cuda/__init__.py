"""``cupy.cuda`` on the stand-in: devices, streams, pinned host memory, the memory pool.

Work is synchronous (numpy runs at once), so streams and events only keep cupy's shape; a
device is a number that arrays remember, current inside ``with Device(n):``.
"""

from __future__ import annotations

from typing import Any

from tests.cuda_cpu.cupy_standin._state import STATE, current_device
from tests.cuda_cpu.cupy_standin.cuda import runtime
from tests.cuda_cpu.cupy_standin.cuda.runtime import check_device

__all__ = [
    "Device",
    "PinnedMemoryPointer",
    "Stream",
    "alloc_pinned_memory",
    "get_current_stream",
    "runtime",
]


class Device:
    """``cupy.cuda.Device(n)``: a context that makes device n current (checked on entry, as
    cupy's is); ``Device()`` is the current one."""

    def __init__(self, device: int | None = None) -> None:
        self.id = current_device() if device is None else int(device)

    def __enter__(self) -> Device:
        STATE.device_stack.append(check_device(self.id))
        return self

    def __exit__(self, *exc: Any) -> None:
        STATE.device_stack.pop()

    def use(self) -> None:
        STATE.device_stack[-1] = check_device(self.id)

    def synchronize(self) -> None:
        check_device(self.id)

    @property
    def compute_capability(self) -> str:
        return "90"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id} (stand-in)>"


class Stream:
    """A stream; the stand-in runs everything at once, so it only has cupy's interface."""

    null: Stream

    def __init__(self, null: bool = False, non_blocking: bool = False) -> None:
        self.device_id = current_device()

    def __enter__(self) -> Stream:
        _STREAMS.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _STREAMS.pop()

    def use(self) -> Stream:
        _STREAMS[-1] = self
        return self

    def synchronize(self) -> None:
        return None


Stream.null = Stream(null=True)
_STREAMS: list[Stream] = [Stream.null]


def get_current_stream() -> Stream:
    return _STREAMS[-1]


class PinnedMemoryPointer(bytearray):
    """Page-locked host memory (here: a bytearray): ``numpy.frombuffer`` views it."""

    @property
    def ptr(self) -> int:
        return id(self)

    @property
    def size(self) -> int:
        return len(self)


def alloc_pinned_memory(nbytes: int) -> PinnedMemoryPointer:
    """Pinned host memory of nbytes; counted, so a test can see buffers reused."""
    STATE.pinned_allocations += 1
    return PinnedMemoryPointer(int(nbytes))


class MemoryPool:
    """cupy's device memory pool: figures and ``free_all_blocks`` only."""

    def used_bytes(self) -> int:
        return 0

    def total_bytes(self) -> int:
        return 0

    def free_all_blocks(self) -> None:
        return None

    def set_limit(self, size: int | None = None, fraction: float | None = None) -> None:
        return None


_POOL = MemoryPool()
