"""``ShardedTable``: one table spread over the ranks of a process group.

Each rank holds an ordinary ``Table`` (its shard: the keys the placement gives it) and the
sharded table routes every call through it. A training step, for rank r with its batch::

    rank r's keys    [ 7, 9, 7, 4 ]      distinct -> [7, 9, 4], counts [2, 1, 1]
    owners           [ 0, 1, 1 ]         the placement of 7, 9, 4 over 2 ranks
    pull   keys + counts ----all_to_all----> owners: Table.pull(every rank's keys, counts=)
           rows + admitted <--all_to_all---- (one pull at each owner, at the global step)
    push   gradients (per distinct key) ---all_to_all---> owners: Table.push(per_position=True)

An owner sums the gradients of a key from every rank before one optimizer update, counts its
admission occurrences from every rank, and stamps ``last_step`` with the global step, so N
ranks pulling and pushing their parts of a global batch leave the same tables as one process
pulling and pushing the whole batch (only float summation order may differ). Each rank
deduplicates before sending: a step moves, per distinct key routed off-rank, 16 bytes out
(key and count), ``4 * (dim + 1)`` back (row and admitted flag) and ``4 * dim`` out again
(gradient), plus one small header per call (see ``evdb.distributed.exchange``).

Every method that touches another rank's keys is collective: every rank calls it, in the same
order, with an empty batch if it has none.

Each call pays its own collectives (3 to pull, 2 to push): a model with many tables pulls and
pushes them together through ``evdb.distributed.ShardedCollection`` (5 a step in all), as
``evdb.torch.EmbeddingBagCollection`` does for its sharded tables.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb._types import BoolArray, Float32Array, Int64Array
from evdb.arrays import check_lookup_buffers, float_matrix
from evdb.bags import parse_bags
from evdb.dedup import Deduper
from evdb.distributed import reads
from evdb.distributed.exchange import Exchange
from evdb.distributed.placement import Placement
from evdb.errors import EvdbError, InvalidArgumentError
from evdb.kernels import backend
from evdb.keys import normalize_keys
from evdb.pulled import Pulled
from evdb.records import RecordBatch
from evdb.table import Table

if TYPE_CHECKING:
    from evdb.distributed.database import ShardedDatabase

__all__ = ["ShardedPulled", "ShardedTable"]

cpu = backend("cpu")  # bound once: a call costs one attribute lookup

# stats() entries that every shard has alike (taken from rank 0) rather than summed
_ALIKE = {"name", "dim", "step", "pushes", "policy", "min_count", "dtype", "capacity", "hashes"}
_ALIKE |= {"counters"}
_PER_SHARD = {"version", "bytes_per_row", "bytes_per_row_by_component", "fill"}  # in "shards" only


@dataclass(frozen=True)
class _Route:
    """Where this rank's distinct keys go: ``order`` (u,) groups them by owner, ``send``
    (ranks,) counts them per owner, ``recv`` (ranks,) counts what each rank sends here."""

    order: Int64Array
    send: Int64Array
    recv: Int64Array


@dataclass(frozen=True, eq=False)
class ShardedPulled(Pulled):
    """What ``ShardedTable.pull`` returns: ``Pulled``'s fields for this rank's batch (so
    ``combine`` and ``combine_backward`` work as they do on one process), and the route and
    the owner's own pull that ``push`` sends the gradients back through."""

    _route: _Route | None = field(default=None, repr=False)
    _owner: Pulled | None = field(default=None, repr=False)


def _merge_stats(parts: list[Any]) -> Any:
    """Sum the numbers of every shard's stats, except those alike on every shard."""
    first = parts[0]
    if isinstance(first, dict):
        out = {}
        for k, v in first.items():
            if k in _PER_SHARD:
                continue
            out[k] = v if k in _ALIKE else _merge_stats([p[k] for p in parts])
        return out
    if isinstance(first, bool) or not isinstance(first, int | float):
        return first
    return sum(parts)


class ShardedTable:
    """A dynamic embedding table spread over the ranks of a ``ShardedDatabase``.

    Create it with ``ShardedDatabase.create_table`` (collective). It has ``Table``'s methods
    and semantics; those marked *collective* must be called by every rank, in the same order.

    Examples
    --------
    On each of 2 ranks (``torchrun --nproc_per_node 2``)::

        db = evdb.distributed.open(root)
        t = db.create_table("item", dim=16, optimizer=evdb.optim.Adagrad(lr=0.1))
        p = t.pull(my_keys)                      # this rank's part of the global batch
        out = p.combine(my_offsets, combiner="sum")
        t.push(p, p.combine_backward(grad_out, my_offsets, combiner="sum"))
        db.advance()
    """

    def __init__(
        self, db: ShardedDatabase, local: Table, placement: Placement, exchange: Exchange
    ) -> None:
        self._db = db
        self.local = local  # this rank's shard: an ordinary Table
        self.placement = placement
        self._x = exchange
        self.name = local.name
        self.config = local.config
        self.dim = local.dim
        self._dedup = Deduper()

    @property
    def database(self) -> ShardedDatabase:
        """The sharded database this table belongs to (this rank's handle)."""
        return self._db

    @property
    def exchange(self) -> Exchange:
        """This rank's end of the database's collectives (``ShardedCollection`` groups the
        tables that share one)."""
        return self._x

    # -- helpers --------------------------------------------------------------------------
    def _keys(self, keys: Any, arg: str = "keys") -> Int64Array:
        self._db.check_open()
        return normalize_keys(keys, self.config.key_type, arg=arg)

    def _refuse(self, op: str) -> None:
        """This rank's arguments were bad: tell the others (which raise too) before raising,
        so a bad batch on one rank costs no timeout."""
        self._x.begin(op, self.name, failed=True)

    def _route(self, op: str, uniq: Int64Array, arg: int = 0) -> _Route:
        owners = self.placement.owners(uniq, self._x.size)
        order = np.argsort(owners, kind="stable")
        send = np.bincount(owners, minlength=self._x.size).astype(np.int64)
        matrix = self._x.begin(op, self.name, send, arg=arg)
        return _Route(order, send, np.ascontiguousarray(matrix[:, self._x.rank]))

    def _to_owners(self, route: _Route, data: np.ndarray, op: str) -> np.ndarray:
        """data (u, ...) aligned with this rank's distinct keys -> what this rank owns, from
        every rank, grouped by source rank."""
        return self._x.all_to_all(data[route.order], route.send, route.recv, op, self.name)

    def _from_owners(self, route: _Route, data: np.ndarray, op: str) -> np.ndarray:
        """The owners' answers (aligned with what ``_to_owners`` delivered) -> aligned with
        this rank's distinct keys."""
        got = self._x.all_to_all(data, route.recv, route.send, op, self.name)
        out = np.empty_like(got)
        out[route.order] = got
        return out

    def _ask(self, op: str, k: Int64Array) -> tuple[_Route, Int64Array, Int64Array, Int64Array]:
        """Deduplicate validated keys and send the distinct ones to their owners:
        (route, distinct keys, inverse, the keys that arrived here)."""
        try:
            uniq, inverse, _ = self._dedup.unique(k)
            self.placement.owners(uniq, self._x.size)  # "div": a key outside the id space
        except EvdbError:
            self._refuse(op)
            raise
        route = self._route(op, uniq)
        return route, uniq, inverse, self._to_owners(route, uniq, op)

    def _checked_keys(self, op: str, keys: Any) -> Int64Array:
        try:
            return self._keys(keys)
        except EvdbError:
            self._refuse(op)
            raise

    # -- read path (collective) -----------------------------------------------------------
    def lookup(
        self,
        keys: Any,
        offsets: Any = None,
        weights: Any = None,
        combiner: str | None = None,
        max_norm: float | None = None,
        *,
        out: Float32Array | None = None,
        promote: bool = False,
        found: BoolArray | None = None,
        step: int | None = None,
    ) -> Float32Array:
        """Collective. ``Table.lookup`` over the whole table: each distinct key is read at its
        owner (never created, never counted; ``promote`` and ``step`` as ``Table.lookup``'s,
        at the owner), and the bags are combined here, in the same kernel a single table
        uses."""
        try:
            k = self._keys(keys)
            n = k.shape[0]
            bags = parse_bags(n, offsets, weights, combiner, max_norm)
            check_lookup_buffers(out, (bags.n_bags, self.dim), found, n)
        except EvdbError:
            self._refuse("lookup")
            raise
        route, _, inverse, mine = self._ask("lookup", k)
        here = np.zeros(mine.shape[0], dtype=bool)
        answer = np.empty((mine.shape[0], self.dim + 1), dtype=np.float32)
        answer[:, : self.dim] = self.local.lookup(mine, found=here, promote=promote, step=step)
        answer[:, self.dim] = here
        back = self._from_owners(route, answer, "lookup")
        if found is not None:
            found[:] = back[inverse, self.dim] > 0
        if out is None:
            out = np.empty((bags.n_bags, self.dim), dtype=np.float32)
        cpu.gather_combine(  # offsets=None: each key its own bag of one, summed (a copy)
            np.ascontiguousarray(back[:, : self.dim]),
            inverse,
            bags.bounds,
            bags.weights,
            bags.combiner,
            bags.max_norm,
            out,
        )
        return out

    def contains(self, keys: Any) -> BoolArray:
        """Collective. (n,) bool: whether each key has a live row at its owner."""
        route, _, inverse, mine = self._ask("contains", self._checked_keys("contains", keys))
        here = self.local.contains(mine).astype(np.int64)
        back: BoolArray = self._from_owners(route, here, "contains")[inverse] > 0
        return back

    def __len__(self) -> int:
        """Collective. Live rows over every shard."""
        return self.count()

    def count(self, *, step: int | None = None) -> int:
        """Collective. Live rows over every shard at ``step`` (default the database's)."""
        self._db.check_open()
        self._x.begin("len", self.name)
        here = np.array([self.local.count(step=step)])
        return int(self._x.all_sum(here, "len", self.name)[0])

    def items(self, chunk_rows: int = 65536) -> Iterator[tuple[Int64Array, Float32Array]]:
        """Not collective: ``(keys, values)`` chunks of the live rows of *this rank's* shard.
        The shards' items together are the table's; ``evdb.distributed.export`` writes them
        merged."""
        return self.local.items(chunk_rows)

    def records(
        self,
        chunk_rows: int = 65536,
        *,
        live_only: bool = False,
        since_version: int | None = None,
        strict: bool = True,
        step: int | None = None,
    ) -> Iterator[tuple[Int64Array, RecordBatch]]:
        """Not collective: ``Table.records`` of *this rank's* shard (the shards' records
        together are the table's)."""
        return self.local.records(
            chunk_rows, live_only=live_only, since_version=since_version, strict=strict, step=step
        )

    def neighbors(
        self,
        query: Any,
        k: int = 10,
        metric: str = "cosine",
        *,
        as_strings: bool = False,
        step: int | None = None,
    ) -> tuple[Any, Float32Array]:
        """Collective. ``Table.neighbors`` over every shard: every rank gets the same answer
        (see ``evdb.distributed.reads``)."""
        return reads.neighbors(self, query, k, metric, as_strings, step)

    def strings(self, keys: Any) -> list[str | None]:
        """Collective. Each key's original string, as its owner keeps it (a table created
        with ``keep_strings=True``)."""
        return reads.strings(self, keys)

    @property
    def keeps_strings(self) -> bool:
        return self.local.keeps_strings

    @property
    def step(self) -> int:
        """The database's global step."""
        return self.local.step

    # -- training path (collective) -------------------------------------------------------
    def pull(self, keys: Any) -> ShardedPulled:
        """Collective. ``Table.pull`` of this rank's batch at the global step: the owners
        count every rank's occurrences, admit, create and stamp, and send the rows back."""
        self._db.check_writable()
        try:
            k = self._keys(keys)
            uniq, inverse, counts = self._dedup.unique(k)
            self.placement.owners(uniq, self._x.size)
        except EvdbError:
            self._refuse("pull")
            raise
        route = self._route("pull", uniq)
        sent = self._to_owners(route, np.stack([uniq, counts], axis=1), "pull")
        owner = self.local.pull(sent[:, 0], counts=sent[:, 1])
        answer = np.empty((sent.shape[0], self.dim + 1), dtype=np.float32)
        np.take(owner.rows, owner.inverse, axis=0, out=answer[:, : self.dim])
        answer[:, self.dim] = owner.admitted[owner.inverse]
        back = self._from_owners(route, answer, "pull")
        return ShardedPulled(
            uniq,
            inverse,
            np.ascontiguousarray(back[:, : self.dim]),
            back[:, self.dim] > 0,
            counts,
            self._db.step,
            self.name,
            _route=route,
            _owner=owner,
        )

    def prefetch(self, keys: Any) -> None:
        """Collective. ``Table.prefetch`` at the owners: every rank's next keys go to their
        owners, which start reading on their own threads the rows they hold on disk."""
        _, _, _, mine = self._ask("prefetch", self._checked_keys("prefetch", keys))
        self.local.prefetch(mine)

    def push(self, pulled: ShardedPulled, grads: Any, *, per_position: bool = False) -> None:
        """Collective. ``Table.push``: each rank's gradients go to the keys' owners, which sum
        them over every rank and apply the optimizer once."""
        self._db.check_writable()
        try:
            if not isinstance(pulled, ShardedPulled) or pulled.table != self.name:
                raise InvalidArgumentError(
                    f"pulled must be what {self.name!r}.pull() returned on this rank, got "
                    f"{type(pulled).__name__}"
                )
            if pulled._owner is None:
                raise InvalidArgumentError(
                    f"pulled: this batch of {self.name!r} came from a ShardedCollection's pull; "
                    "push it through the collection's push"
                )
            # a double or stale push is refused on every rank before the gradients travel
            self.local.check_pushable(pulled._owner)
            u, n = pulled.keys.shape[0], pulled.inverse.shape[0]
            g = float_matrix(grads, ((n if per_position else u), self.dim), "grads")
            if per_position:  # sum each key's positions here: one row per key on the wire
                summed = np.zeros((u, self.dim), dtype=np.float32)
                np.add.at(summed, pulled.inverse, g)
                g = summed
        except EvdbError:
            self._refuse("push")
            raise
        route, owner = pulled._route, pulled._owner
        assert route is not None and owner is not None
        self._x.begin("push", self.name)
        arrived = self._to_owners(route, g, "push")
        self.local.push(owner, arrived, per_position=True)

    # -- writes (collective) --------------------------------------------------------------
    def upsert(self, keys: Any, values: Any, *, freeze: bool | None = None) -> None:
        """Collective. ``Table.upsert`` at the owners. A key given twice takes its last value;
        given by several ranks, the highest rank's. ``freeze`` must be the same on every
        rank."""
        self._db.check_writable()
        try:
            k = self._keys(keys)
            v = float_matrix(values, (k.shape[0], self.dim), "values")
            if freeze not in (None, True, False):
                raise InvalidArgumentError(f"freeze must be None, True or False, got {freeze!r}")
            uniq, inverse, _ = self._dedup.unique(k)
            last = np.zeros(uniq.shape[0], dtype=np.int64)
            np.maximum.at(last, inverse, np.arange(k.shape[0]))
            self.placement.owners(uniq, self._x.size)
        except EvdbError:
            self._refuse("upsert")
            raise
        route = self._route("upsert", uniq, arg={None: 0, True: 1, False: 2}[freeze])
        mine = self._to_owners(route, uniq, "upsert")
        rows = self._to_owners(route, v[last], "upsert")
        self.local.upsert(mine, rows, freeze=freeze)

    def delete(self, keys: Any) -> int:
        """Collective. ``Table.delete`` at the owners; returns the live rows removed by every
        rank's call together (the same number on every rank)."""
        self._db.check_writable()
        _, _, _, mine = self._ask("delete", self._checked_keys("delete", keys))
        removed = self.local.delete(mine)
        return int(self._x.all_sum(np.array([removed]), "delete", self.name)[0])

    def compact(self) -> dict[str, int]:
        """Collective. ``Table.compact`` on every shard; the counts summed."""
        self._db.check_writable()
        self._x.begin("compact", self.name)
        done = self.local.compact()
        names = sorted(done)
        total = self._x.all_sum(np.array([done[k] for k in names]), "compact", self.name)
        return dict(zip(names, (int(v) for v in total), strict=True))

    # -- reports (collective) -------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Collective. The shards' ``stats()`` summed, and ``"shards"``: each shard's rows
        (the anchors' per-partition ``total_count()``) and ``"imbalance"``: the most rows on
        one shard over the mean (1.0 is even)."""
        self._db.check_open()
        self._x.begin("stats", self.name)
        parts = self._x.gather_objects(self.local.stats(), "stats", self.name)
        out: dict[str, Any] = _merge_stats(parts)
        rows = [int(p["rows"]) for p in parts]
        mean = sum(rows) / len(rows)
        out["shards"] = [
            {"rank": r, "rows": n, "version": int(p["version"])}
            for r, (n, p) in enumerate(zip(rows, parts, strict=True))
        ]
        out["imbalance"] = max(rows) / mean if mean else 1.0
        out["placement"] = self.placement.to_dict()
        return out

    @property
    def learning_rate(self) -> float:
        """The optimizer's current learning rate (set it on every rank alike)."""
        return self.local.learning_rate

    @learning_rate.setter
    def learning_rate(self, lr: float) -> None:
        self.local.learning_rate = lr

    def __repr__(self) -> str:
        return (
            f"ShardedTable({self.name!r}, dim={self.dim}, shard {self._x.rank} of "
            f"{self._x.size}, placement={self.placement.kind!r})"
        )
