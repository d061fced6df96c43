"""``TrainPipeline``: batch i+1's key exchange and disk prefetch while batch i computes.

A step of a ``ShardedCollection`` is keys out, rows back, compute, gradients out. Only the
keys of the next batch are known before this step's push, so only they can move early (the
rows cannot: this step's push changes them). As TorchRec's ``TrainPipelineSparseDist``
starts the next batch's input all-to-all during this batch's compute, and FBGEMM's SSD
tables prefetch batch i+1's rows while batch i trains, the pipeline sends batch i+1's keys to
their owners, which start reading those rows from disk, on a background thread while the
caller computes batch i::

    main thread    pull_rows(i) | compute i, push i, advance | pull_rows(i+1) | compute ...
    pipeline            send_keys(i+1), owners prefetch   |     send_keys(i+2), ...

The owners pull exactly what they would have pulled, in the same order and at the same step
(``pull_rows`` runs after push i on every rank), so the tables and every pulled row equal
the plain loop's, bit for bit. The early key exchange runs on the pipeline's own gloo
process group, so its collectives never interleave with the main thread's; making one is
collective over every rank of the default group (``torch.distributed.new_group``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import torch.distributed as dist

from evdb.distributed.exchange import Exchange
from evdb.distributed.group import CollectionPulled, KeysInFlight, ShardedCollection

__all__ = ["TrainPipeline"]

B = TypeVar("B")


class TrainPipeline:
    """Runs a ``ShardedCollection``'s training loop with the next batch's keys in flight.

    Parameters
    ----------
    collection : ShardedCollection
        The tables the loop pulls and pushes.
    prefetch : bool
        Whether the owners start reading the next batch's rows from disk as soon as its keys
        arrive (``Table.prefetch``; a no-op for tables that spilled nothing).

    Examples
    --------
    ``run`` yields each batch with its pulled rows; push and advance before asking for the
    next one (the loop's body is the plain loop's, without the pull)::

        pipe = TrainPipeline(coll)                       # collective
        for batch, p in pipe.run(loader, keys_of=lambda b: {"user": b.user, "item": b.item}):
            out = model(p["user"].combine(batch.user_offsets), ...)
            loss.backward()
            coll.push(p, grads)
            db.advance()
        pipe.close()
    """

    def __init__(self, collection: ShardedCollection, *, prefetch: bool = True) -> None:
        if not isinstance(collection, ShardedCollection):
            raise TypeError(
                f"collection must be a ShardedCollection, got {type(collection).__name__}"
            )
        self.collection = collection
        self.prefetch = prefetch
        ranks = dist.get_process_group_ranks(collection.exchange.group)
        self._exchange = Exchange(dist.new_group(ranks=ranks, backend="gloo"))
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="evdb-pipeline")

    def _send(self, batch: Mapping[str, Any]) -> KeysInFlight:
        inflight = self.collection.send_keys(batch, exchange=self._exchange)
        if self.prefetch:
            self.collection.prefetch_rows(inflight)
        return inflight

    def run(
        self, batches: Iterable[B], keys_of: Callable[[B], Mapping[str, Any]]
    ) -> Iterator[tuple[B, CollectionPulled]]:
        """Collective. Yield ``(batch, pulled)`` for each batch (``keys_of(batch)`` is the
        mapping table name -> keys that ``ShardedCollection.pull`` takes), with the next
        batch's keys sent while the caller works on this one. Every rank iterates alike (the
        same number of batches)."""
        it = iter(batches)
        done = object()
        current: Any = next(it, done)
        if current is done:
            return
        pending: Future[KeysInFlight] = self._pool.submit(self._send, keys_of(current))
        while current is not done:
            inflight = pending.result()  # raises what the exchange raised
            pulled = self.collection.pull_rows(inflight)
            following: Any = next(it, done)
            if following is not done:  # its keys travel while the caller computes this one
                pending = self._pool.submit(self._send, keys_of(following))
            yield current, pulled
            current = following

    def close(self) -> None:
        """Stop the pipeline's thread (its process group stays until the job ends)."""
        self._pool.shutdown(wait=True)

    def __enter__(self) -> TrainPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
