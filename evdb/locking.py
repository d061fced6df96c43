"""A database's readers-writer lock, and the decorators that take it around its operations.

One ``RWLock`` per ``Database``, shared by its tables. Operations that change nothing take it
shared, so threads read at once (numba's kernels let go of the GIL, so they really run side by
side); everything that mutates takes it exclusive; ``close`` takes it exclusive too, so it
waits for the calls in flight, and calls after it raise ``DatabaseClosedError``.

The lock prefers writers: once a writer waits, new readers wait behind it, so a stream of
lookups cannot starve a trainer's push. It is reentrant in the ways evdb's own operations nest
(public methods call each other): a thread that holds it, either way, may take it shared again,
and a writer may take it exclusive again. A reader asking for it exclusive is refused (it would
wait for itself forever).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from evdb.errors import ConcurrentModificationError, EvdbError

__all__ = ["RWLock", "exclusive", "locked_chunks", "reading", "shared"]

P = ParamSpec("P")
R = TypeVar("R")


class RWLock:
    """Many readers or one writer, writer-preferring, reentrant for nested calls."""

    def __init__(self) -> None:
        # guards the counts below; waits go through the condition over the same lock
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._readers = 0  # threads holding it shared (each counted once)
        self._writer = 0  # thread ident of the exclusive holder; 0: none
        self._depth = 0  # the writer's nested exclusive holds
        self._waiting = 0  # writers waiting: new readers wait behind them
        self._sleepers = 0  # threads waiting, readers or writers (woken when one leaves)
        self._mine = threading.local()  # .n: this thread's nested shared holds
        self.writes = 0  # writes completed (``exclusive``): a scan notices one between chunks

    # The fast paths take the mutex with acquire()/release() rather than ``with`` (0.10 against
    # 0.27 us here): nothing between the two can raise.

    def acquire_shared(self) -> bool:
        """Take it shared; returns whether this thread held it already (either way)."""
        mine = self._mine
        held = getattr(mine, "n", 0)
        if held or (self._writer and self._writer == threading.get_ident()):
            mine.n = held + 1  # nested: this thread already keeps writers (or readers) out
            return True
        mutex = self._mutex
        mutex.acquire()
        if self._writer or self._waiting:
            mutex.release()
            self._wait_shared()
        else:
            self._readers += 1
            mutex.release()
        mine.n = 1
        return False

    def _wait_shared(self) -> None:
        with self._mutex:
            self._sleepers += 1
            try:
                while self._writer or self._waiting:
                    self._cond.wait()
            finally:
                self._sleepers -= 1
            self._readers += 1

    def release_shared(self) -> None:
        mine = self._mine
        n = mine.n = mine.n - 1
        if n or (self._writer and self._writer == threading.get_ident()):
            return
        mutex = self._mutex
        mutex.acquire()
        self._readers -= 1
        if not self._readers and self._sleepers:
            self._cond.notify_all()
        mutex.release()

    def acquire_exclusive(self) -> None:
        me = threading.get_ident()
        if self._writer == me:
            self._depth += 1
            return
        mutex = self._mutex
        mutex.acquire()
        if self._writer or self._readers:
            mutex.release()
            self._wait_exclusive()
        else:
            self._writer = me
            self._depth = 1
            mutex.release()

    def _wait_exclusive(self) -> None:
        if getattr(self._mine, "n", 0):  # a reader of its own counts in _readers: only here
            raise EvdbError(
                "a thread reading the database asked to write to it inside that read "
                "(it would wait for itself); this is a bug in evdb"
            )
        with self._mutex:
            self._waiting += 1
            self._sleepers += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._waiting -= 1
                self._sleepers -= 1
            self._writer = threading.get_ident()
            self._depth = 1

    def release_exclusive(self) -> None:
        self._depth -= 1
        if self._depth:
            return
        mutex = self._mutex
        mutex.acquire()
        self._writer = 0
        if self._sleepers:
            self._cond.notify_all()
        mutex.release()

    @property
    def writers_waiting(self) -> int:
        """Writers waiting for the lock (new readers wait behind them)."""
        return self._waiting

    def held_exclusive(self) -> bool:
        """Whether the calling thread holds the lock exclusive."""
        return self._writer == threading.get_ident()

    def held(self) -> bool:
        """Whether the calling thread holds the lock, either way."""
        return bool(getattr(self._mine, "n", 0)) or self.held_exclusive()


class _Locked(Protocol):
    _rwlock: RWLock


class _Reader(_Locked, Protocol):
    def _reads_mutate(self) -> bool: ...


L = TypeVar("L", bound=_Locked)
T = TypeVar("T", bound=_Reader)


def shared(method: Callable[Concatenate[L, P], R]) -> Callable[Concatenate[L, P], R]:
    """Run the method holding its object's ``_rwlock`` shared (a read that changes nothing)."""

    @functools.wraps(method)
    def locked(self: L, /, *args: P.args, **kwargs: P.kwargs) -> R:
        lock = self._rwlock
        lock.acquire_shared()
        try:
            return method(self, *args, **kwargs)
        finally:
            lock.release_shared()

    return locked


def exclusive(method: Callable[Concatenate[L, P], R]) -> Callable[Concatenate[L, P], R]:
    """Run the method holding its object's ``_rwlock`` exclusive (anything that mutates), and
    count it in ``writes``."""

    @functools.wraps(method)
    def locked(self: L, /, *args: P.args, **kwargs: P.kwargs) -> R:
        lock = self._rwlock
        lock.acquire_exclusive()
        try:
            return method(self, *args, **kwargs)
        finally:
            lock.writes += 1
            lock.release_exclusive()

    return locked


def reading(method: Callable[Concatenate[T, P], R]) -> Callable[Concatenate[T, P], R]:
    """Run a read shared, unless its object says a read would mutate it now
    (``_reads_mutate()``, asked under the shared lock, so no writer changes the answer): then
    exclusive. A thread that holds the lock already runs it as it holds it (nested in a
    reader, nothing that would mutate can have started since that reader asked)."""

    @functools.wraps(method)
    def locked(self: T, /, *args: P.args, **kwargs: P.kwargs) -> R:
        lock = self._rwlock
        nested = lock.acquire_shared()
        try:
            if nested or not self._reads_mutate():
                return method(self, *args, **kwargs)
        finally:
            lock.release_shared()
        lock.acquire_exclusive()
        try:
            return method(self, *args, **kwargs)
        finally:
            lock.release_exclusive()

    return locked


@contextmanager
def _reading_hold(reader: _Reader) -> Iterator[None]:
    """The lock, as ``reading`` takes it, around one chunk of a scan."""
    lock = reader._rwlock
    nested = lock.acquire_shared()
    alone = False
    try:
        if not nested and reader._reads_mutate():
            lock.release_shared()
            lock.acquire_exclusive()
            alone = True
        yield
    finally:
        if alone:
            lock.release_exclusive()
        else:
            lock.release_shared()


C = TypeVar("C")


def locked_chunks(
    reader: _Reader,
    chunks: Iterator[C],
    check_open: Callable[[], None],
    *,
    strict: bool,
    what: str,
) -> Iterator[C]:
    """The chunks of a scan, each one read holding the reader's lock (as ``reading`` takes
    it), never across a ``yield``: a generator left unfinished would keep writers out for good.

    A write between two chunks (``RWLock.writes`` moved: rows may have moved between tiers)
    could make the scan miss or repeat rows: with ``strict`` the next chunk raises
    ``ConcurrentModificationError`` naming ``what``; without, the scan goes on (a sample, a
    dashboard). A scan inside its caller's exclusive hold (checkpoint, publish) sees only its
    own writes."""
    lock = reader._rwlock
    own = lock.held_exclusive()
    writes = lock.writes
    while True:
        with _reading_hold(reader):
            check_open()  # a closed store cannot be read
            if strict and not own and lock.writes != writes:
                raise ConcurrentModificationError(
                    f"{what} changed while it was being scanned (a write to the database came "
                    "between two chunks of items()); iterate again, or hold the writes until "
                    "the scan ends"
                )
            chunk = next(chunks, None)
            writes = lock.writes
        if chunk is None:
            return
        yield chunk
