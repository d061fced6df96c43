"""``ShardedCollection``: many sharded tables, one exchange per direction and step.

``ShardedTable.pull`` and ``push`` pay their collectives per table (a header and two
payloads to pull, a header and one payload to push), so a model with 26 tables makes 130
collectives a step, each a network round trip whatever its size. A collection makes 5,
whatever the number of tables, as TorchRec's ``KJTAllToAll`` sends every feature of an
``EmbeddingBagCollection`` in one all-to-all::

    rank r's batch      {"user": [3, 3, 8], "item": [7, 9, 7, 4]}
    distinct per table  user [3, 8]          item [7, 9, 4]     (counts travel with them)
    pull   one header all_gather    (op, collection, call, step; int64 elements per rank)
           one int64 all_to_all     to each rank j: [u_user_j, u_item_j] + user (key, count)
                                    pairs owned by j + item pairs owned by j
           owners: Table.pull per table (every rank's keys, counts=), in rank order
           one float all_to_all     back: each table's (row, admitted) of dim + 1 per key
    push   one header all_gather    (every rank pushes, none refused its input)
           one float all_to_all     each table's gradient rows (dim per key) to the owners
           owners: Table.push per table (summed over every rank, one optimizer update)

The owners run the same ``Table.pull`` and ``Table.push`` calls, with the same arguments in
the same order, as ``ShardedTable``'s per-table path, so a collection's tables equal those
of per-table calls bit for bit, and (up to float summation order) one process pulling and
pushing the whole global batch.

Rows and gradients cross as float32 by default. ``payload_dtype="bfloat16"`` or
``"float16"`` (TorchRec's ``QCommsConfig``) halves those bytes: every row a rank pulls is
the payload's rounding of the stored float32 row (a rank's own keys too, so a result never
depends on where a key lives), and each rank's per-key gradient sum is rounded before it
travels; the owners keep and update float32 rows, and add the ranks' rounded gradients in
float32. float16 overflows beyond 65,504.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from evdb._types import Int64Array
from evdb.arrays import float_matrix
from evdb.dedup import Deduper
from evdb.distributed.exchange import Exchange
from evdb.distributed.table import ShardedPulled, ShardedTable
from evdb.errors import ConfigError, EvdbError, InvalidArgumentError
from evdb.keys import normalize_keys
from evdb.pulled import Pulled

__all__ = ["PAYLOAD_DTYPES", "CollectionPulled", "KeysInFlight", "ShardedCollection"]

PAYLOAD_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _code(names: Sequence[str], payload: str) -> str:
    """The collection's identity in the headers: its tables, in order, and payload dtype."""
    return f"collection({', '.join(names)}; {payload})"


@dataclass(frozen=True)
class _Route:
    """Where this rank's distinct keys of every table went.

    ``order[t]`` (u_t,) groups table t's distinct keys by owner; ``send`` (T, ranks) counts
    the keys of each table this rank sends to each rank; ``recv`` (T, ranks) those each rank
    sends here (so the owners' answers and the gradients need no header of their own)."""

    order: list[Int64Array]
    send: Int64Array
    recv: Int64Array


@dataclass(frozen=True)
class KeysInFlight:
    """A grouped pull whose keys reached their owners but whose rows did not come back yet:
    ``ShardedCollection.send_keys`` returns it and ``ShardedCollection.pull_rows`` finishes
    it (the pipeline keeps one in flight while a step computes)."""

    uniq: list[Int64Array]
    inverse: list[Int64Array]
    counts: list[Int64Array]
    route: _Route
    arrived: list[Int64Array]  # per table: (m_t, 2) (key, count) from every rank, rank order
    calls: int  # the collection's call at send_keys: pull_rows refuses an older one


class CollectionPulled(Mapping[str, ShardedPulled]):
    """What ``ShardedCollection.pull`` returns: a read-only mapping table name ->
    ``ShardedPulled`` (``combine`` and ``combine_backward`` work on each as on one process),
    to give back whole to ``ShardedCollection.push``."""

    def __init__(
        self, parts: dict[str, ShardedPulled], route: _Route, owners: list[Pulled], serial: int
    ) -> None:
        self._parts = parts
        self._route = route
        self._owners = owners
        self._serial = serial

    def __getitem__(self, name: str) -> ShardedPulled:
        return self._parts[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{n}: {p.keys.shape[0]} keys" for n, p in self._parts.items())
        return f"CollectionPulled({sizes})"


class ShardedCollection:
    """Several sharded tables of one ``ShardedDatabase``, pulled and pushed together in one
    exchange per direction: 3 collectives to pull and 2 to push, whatever their number.

    Parameters
    ----------
    tables : sequence of ShardedTable, or mapping name -> ShardedTable
        Distinct tables of one sharded database (dims and optimizers may differ). Every rank
        builds the same collection (same tables, same order, same payload dtype); a rank
        that uses another is caught by the next call's header (``CollectiveError``).
    payload_dtype : "float32" | "bfloat16" | "float16"
        How rows and gradients cross between ranks (see the module docstring). Keys and
        counts always cross as int64.

    Examples
    --------
    On each of 2 ranks, with ``user`` (dim 8, SGD) and ``item`` (dim 16, Adagrad) tables::

        coll = evd.ShardedCollection([user, item], payload_dtype="bfloat16")
        p = coll.pull({"user": user_ids, "item": item_ids})     # 3 collectives
        u = p["user"].combine(user_offsets, combiner="sum")
        i = p["item"].combine(item_offsets, combiner="mean")
        ...                                                      # dense forward, backward
        coll.push(p, {"user": p["user"].combine_backward(gu, user_offsets, combiner="sum"),
                      "item": p["item"].combine_backward(gi, item_offsets, combiner="mean")})
        db.advance()

    Every method is collective: every rank calls it, in the same order, with an empty batch
    for a table it has no keys of (a table left out of the batch is an empty batch).
    """

    def __init__(
        self,
        tables: Sequence[ShardedTable] | Mapping[str, ShardedTable],
        *,
        payload_dtype: str = "float32",
    ) -> None:
        listed = list(tables.values() if isinstance(tables, Mapping) else tables)
        if not listed:
            raise ConfigError("tables: a collection needs at least one sharded table")
        for i, t in enumerate(listed):
            if not isinstance(t, ShardedTable):
                raise ConfigError(f"tables[{i}] must be a ShardedTable, got {type(t).__name__}")
            if t.exchange is not listed[0].exchange:
                raise ConfigError(
                    f"tables[{i}] ({t.name!r}) belongs to another sharded database than "
                    f"tables[0] ({listed[0].name!r}): a collection exchanges over one"
                )
        names = [t.name for t in listed]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:
            raise ConfigError(f"tables: {twice!r} is given twice; give each table once")
        if payload_dtype not in PAYLOAD_DTYPES:
            raise ConfigError(
                f"payload_dtype must be one of {list(PAYLOAD_DTYPES)}, got {payload_dtype!r}"
            )
        self.tables: dict[str, ShardedTable] = {t.name: t for t in listed}
        self.payload_dtype = payload_dtype
        self._wire = PAYLOAD_DTYPES[payload_dtype]
        self._x: Exchange = listed[0].exchange
        self._db = listed[0].database
        self._list = listed
        self._dims = np.array([t.dim for t in listed], dtype=np.int64)
        self._code = _code(names, payload_dtype)
        self._dedup = Deduper()
        self._sent = 0  # send_keys calls: pull_rows takes only the latest, once
        self._pulls = 0  # pull_rows calls: push takes only the latest, once
        self._pushed = -1

    @property
    def exchange(self) -> Exchange:
        """This rank's end of the tables' database's collectives."""
        return self._x

    def __repr__(self) -> str:
        return (
            f"ShardedCollection({list(self.tables)}, payload_dtype={self.payload_dtype!r}, "
            f"shard {self._x.rank} of {self._x.size})"
        )

    # -- the batch ------------------------------------------------------------------------
    def _refuse(self, op: str, x: Exchange | None = None) -> None:
        (x or self._x).begin(op, self._code, arg=len(self._list), failed=True)

    def _batch(self, batch: Any) -> list[Int64Array]:
        """The batch as one int64 key array per table, in the collection's order."""
        if not isinstance(batch, Mapping):
            raise InvalidArgumentError(
                f"batch must be a mapping table name -> keys, got {type(batch).__name__}"
            )
        unknown = next((n for n in batch if n not in self.tables), None)
        if unknown is not None:
            raise InvalidArgumentError(
                f"batch[{unknown!r}]: no such table in this collection; tables: {list(self.tables)}"
            )
        out = []
        for t in self._list:
            keys = batch.get(t.name, ())
            out.append(normalize_keys(keys, t.config.key_type, arg=f"batch[{t.name!r}]"))
        return out

    # -- pull -----------------------------------------------------------------------------
    def send_keys(
        self, batch: Mapping[str, Any], *, exchange: Exchange | None = None
    ) -> KeysInFlight:
        """Collective. The first half of ``pull``: deduplicate each table's keys and send them,
        with their counts, to their owners (one header, one int64 all-to-all). Nothing changes
        at the owners until ``pull_rows`` (``prefetch_rows`` may start reading the rows from
        disk meanwhile). ``exchange``: another ``Exchange`` over the same ranks to send them
        on (the pipeline's, on its own process group, from its own thread)."""
        self._db.check_writable()
        x, n_tables = exchange or self._x, len(self._list)
        try:
            keys = self._batch(batch)
            uniq, inverse, counts, owners = [], [], [], []
            for t, k in zip(self._list, keys, strict=True):
                u, inv, c = self._dedup.unique(k)
                owners.append(t.placement.owners(u, x.size, arg=f"batch[{t.name!r}]"))
                uniq.append(u)
                inverse.append(inv)
                counts.append(c)
        except EvdbError:
            self._refuse("group_pull", x)
            raise
        order = [np.argsort(o, kind="stable") for o in owners]
        send = np.stack([np.bincount(o, minlength=x.size) for o in owners]).astype(np.int64)
        # to rank j: the T key counts, then each table's (key, count) pairs owned by j
        sizes = n_tables + 2 * send.sum(axis=0)
        pieces: list[np.ndarray] = []
        starts = np.zeros((n_tables, x.size + 1), dtype=np.int64)
        np.cumsum(send, axis=1, out=starts[:, 1:])
        pairs = [
            np.stack([u[o], c[o]], axis=1) for u, c, o in zip(uniq, counts, order, strict=True)
        ]
        for j in range(x.size):
            pieces.append(send[:, j])
            pieces.extend(p[s[j] : s[j + 1]].ravel() for p, s in zip(pairs, starts, strict=True))
        flat = np.concatenate(pieces) if pieces else np.empty(0, np.int64)
        matrix = x.begin("group_pull", self._code, sizes, arg=n_tables)
        got = x.all_to_all(flat, sizes, matrix[:, x.rank], "group_pull", self._code)
        # what each rank sent here, per table, in rank order
        recv = np.empty((n_tables, x.size), dtype=np.int64)
        parts: list[list[np.ndarray]] = [[] for _ in range(n_tables)]
        at = 0
        for i in range(x.size):
            recv[:, i] = got[at : at + n_tables]
            at += n_tables
            for ti in range(n_tables):
                m = 2 * int(recv[ti, i])
                parts[ti].append(got[at : at + m].reshape(-1, 2))
                at += m
        arrived = [np.concatenate(p) if p else np.empty((0, 2), np.int64) for p in parts]
        self._sent += 1
        return KeysInFlight(uniq, inverse, counts, _Route(order, send, recv), arrived, self._sent)

    def prefetch_rows(self, inflight: KeysInFlight) -> None:
        """Not collective. Tell each owner shard to start reading from disk the rows of the
        keys that arrived for it (``Table.prefetch``: a hint that changes no result)."""
        for t, a in zip(self._list, inflight.arrived, strict=True):
            t.local.prefetch(a[:, 0])

    def pull_rows(self, inflight: KeysInFlight) -> CollectionPulled:
        """Collective. The second half of ``pull``: each owner pulls the keys that arrived
        (``Table.pull`` with every rank's counts, at the global step) and sends the rows
        back (one float all-to-all)."""
        self._db.check_writable()
        if inflight.calls != self._sent or self._pulls == self._sent:
            raise InvalidArgumentError(  # the same on every rank: no collective is skipped
                f"inflight: keys #{inflight.calls} were pulled already or are stale (the latest "
                f"send_keys is #{self._sent}); finish each send_keys with one pull_rows"
            )
        self._pulls = inflight.calls
        route = inflight.route
        owners = []
        answers: list[np.ndarray] = []
        for t, a in zip(self._list, inflight.arrived, strict=True):
            owner = t.local.pull(a[:, 0], counts=a[:, 1])
            answer = np.empty((a.shape[0], t.dim + 1), dtype=np.float32)
            np.take(owner.rows, owner.inverse, axis=0, out=answer[:, : t.dim])
            answer[:, t.dim] = owner.admitted[owner.inverse]
            owners.append(owner)
            answers.append(answer)
        width = self._dims + 1
        back = self._exchange_rows(answers, route.recv, route.send, width, "group_pull")
        parts = {}
        for i, t in enumerate(self._list):
            rows = np.empty_like(back[i])
            rows[route.order[i]] = back[i]
            parts[t.name] = ShardedPulled(
                inflight.uniq[i],
                inflight.inverse[i],
                np.ascontiguousarray(rows[:, : t.dim]),
                rows[:, t.dim] > 0,
                inflight.counts[i],
                self._db.step,
                t.name,
            )
        return CollectionPulled(parts, route, owners, inflight.calls)

    def pull(self, batch: Mapping[str, Any]) -> CollectionPulled:
        """Collective. ``Table.pull`` of every table's keys in this rank's batch (a mapping
        table name -> keys; a table left out is an empty batch), in one exchange: the owners
        count every rank's occurrences, admit, create and stamp, and send the rows back."""
        return self.pull_rows(self.send_keys(batch))

    # -- push -----------------------------------------------------------------------------
    def push(
        self, pulled: CollectionPulled, grads: Mapping[str, Any], *, per_position: bool = False
    ) -> None:
        """Collective. ``Table.push`` of every table in one exchange: each rank's gradients
        (a mapping table name -> (u, dim) aligned with ``pulled[name].keys``, or (n, dim) per
        position with ``per_position=True``; every table of the collection) go to the keys'
        owners, which sum them over every rank and apply each table's optimizer once."""
        self._db.check_writable()
        x = self._x
        try:
            if not isinstance(pulled, CollectionPulled) or list(pulled) != list(self.tables):
                raise InvalidArgumentError(
                    f"pulled must be what this collection's pull() returned on this rank, got "
                    f"{type(pulled).__name__}"
                )
            if pulled._serial <= self._pushed or pulled._serial != self._pulls:
                raise InvalidArgumentError(
                    f"pulled: grouped pull #{pulled._serial} was pushed already or is stale "
                    f"(the latest is #{self._pulls}); push each pull once, before the next"
                )
            if not isinstance(grads, Mapping):
                raise InvalidArgumentError(
                    f"grads must be a mapping table name -> gradients, got {type(grads).__name__}"
                )
            missing = next((n for n in self.tables if n not in grads), None)
            extra = next((n for n in grads if n not in self.tables), None)
            if missing is not None or extra is not None:
                raise InvalidArgumentError(
                    f"grads: {'no gradients for' if missing else 'no such table'} "
                    f"{missing if missing is not None else extra!r}; give every table of the "
                    f"collection: {list(self.tables)}"
                )
            sums = []
            for i, (t, owner) in enumerate(zip(self._list, pulled._owners, strict=True)):
                t.local.check_pushable(owner)  # a stale owner pull: refused on every rank
                p = pulled[t.name]
                u, n = p.keys.shape[0], p.inverse.shape[0]
                g = float_matrix(
                    grads[t.name], ((n if per_position else u), t.dim), f"grads[{t.name!r}]"
                )
                if per_position:  # sum each key's positions here: one row per key on the wire
                    summed = np.zeros((u, t.dim), dtype=np.float32)
                    np.add.at(summed, p.inverse, g)
                    g = summed
                sums.append(g[pulled._route.order[i]])
        except EvdbError:
            self._refuse("group_push")
            raise
        x.begin("group_push", self._code, arg=len(self._list))
        self._pushed = pulled._serial
        route = pulled._route
        arrived = self._exchange_rows(sums, route.send, route.recv, self._dims, "group_push")
        for t, owner, g in zip(self._list, pulled._owners, arrived, strict=True):
            t.local.push(owner, g, per_position=True)

    # -- the float payload ----------------------------------------------------------------
    def _exchange_rows(
        self,
        data: list[np.ndarray],
        send: Int64Array,
        recv: Int64Array,
        width: Int64Array,
        op: str,
    ) -> list[np.ndarray]:
        """One all-to-all of every table's float rows. ``data[t]`` (sum of send[t], width[t])
        is grouped by destination (``send[t, j]`` rows to rank j); returns per table what
        arrived (sum of recv[t], width[t]), grouped by source rank. Rows cross as the payload
        dtype and come back as float32 (rounded, for 16-bit payloads, on every rank)."""
        x, n_tables = self._x, len(data)
        starts = np.zeros((n_tables, x.size + 1), dtype=np.int64)
        np.cumsum(send, axis=1, out=starts[:, 1:])
        pieces = [
            data[t][starts[t, j] : starts[t, j + 1]].ravel()
            for j in range(x.size)
            for t in range(n_tables)
        ]
        flat = torch.from_numpy(np.concatenate(pieces) if pieces else np.empty(0, np.float32))
        if self._wire is not torch.float32:
            flat = flat.to(self._wire)
        send_elems = (send * width[:, None]).sum(axis=0)
        recv_elems = (recv * width[:, None]).sum(axis=0)
        got = x.all_to_all_tensor(flat, send_elems, recv_elems, op, self._code)
        if got.dtype is not torch.float32:
            got = got.to(torch.float32)
        arrays = got.numpy()
        parts: list[list[np.ndarray]] = [[] for _ in range(n_tables)]
        at = 0
        for i in range(x.size):
            for t in range(n_tables):
                m = int(recv[t, i]) * int(width[t])
                parts[t].append(arrays[at : at + m].reshape(-1, int(width[t])))
                at += m
        return [np.concatenate(p) if len(p) > 1 else np.ascontiguousarray(p[0]) for p in parts]
