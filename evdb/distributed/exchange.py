"""The collectives a sharded table runs, on a ``torch.distributed`` process group.

Every sharded operation starts with one ``all_gather`` of a small header: the operation, the
table, a call counter and what this rank sends to each other rank. It checks that every rank
is in the same call (a rank that skipped or reordered one raises ``CollectiveError`` naming
the ranks and their calls, instead of pairing mismatched collectives), and it gives every rank
the whole send-size matrix, so the ``all_to_all_single`` calls that follow know their receive
sizes without another round trip. Payloads then go as ``all_to_all_single`` over int64 and
float32 tensors with uneven (and zero) splits, which gloo runs in torch 2.13 (its list form
``all_to_all`` and uneven ``all_gather`` do not).

A rank that dies makes the next collective fail on the others (gloo reports the closed
connection, or the process group's timeout expires): that failure becomes ``CollectiveError``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import xxhash

from evdb._types import Int64Array
from evdb.errors import CollectiveError

__all__ = ["Exchange"]

# Operation codes of the header; a new operation goes last (the code is only compared).
OPS = (
    "open",
    "create_table",
    "drop_table",
    "advance",  # (no longer a collective of its own; kept so the codes stay)
    "flush",
    "checkpoint",
    "close",
    "pull",
    "push",
    "lookup",
    "contains",
    "upsert",
    "delete",
    "len",
    "compact",
    "stats",
    "publish",
    "prefetch",
    "group_pull",
    "group_push",
    "group_keys",
    "restore",
)
_HEAD = 6  # op, table, call number, argument code, global step, failed (refused its input)
_SAME = 5  # the first _SAME fields must agree on every rank


def _name_code(name: str) -> int:
    return int(np.uint64(xxhash.xxh3_64_intdigest(name.encode())).view(np.int64))


class Exchange:
    """This rank's end of the collectives of one sharded database.

    Parameters
    ----------
    group : torch.distributed.ProcessGroup
        The group to run on (gloo on CPU tensors).
    """

    def __init__(self, group: Any) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.calls = 0  # collective calls made so far: every rank must be at the same one
        # The global step, compared in every header: advancing needs no collective of its own
        # (a rank that advanced differently is caught at the next call).
        self.step = 0

    def _fail(self, op: str, table: str, e: BaseException) -> CollectiveError:
        return CollectiveError(
            f"rank {self.rank} of {self.size}: the {op} of {table or 'the database'!r} failed "
            f"in a collective (a rank died, stopped calling, or the process group timed out): "
            f"{e}"
        )

    def begin(
        self,
        op: str,
        table: str = "",
        sizes: Int64Array | None = None,
        *,
        arg: int = 0,
        failed: bool = False,
    ) -> Int64Array:
        """Start a collective operation: check every rank is in the same call (same ``op``,
        ``table`` and call argument ``arg``), and share what each sends to each. Returns the
        (size, size) int64 matrix whose row i is what rank i sends to each rank (zeros when
        ``sizes`` is None). ``failed=True`` says this rank refused its input: every other
        rank raises ``CollectiveError`` at once (the refusing rank raises its own error)."""
        self.calls += 1
        if self.size == 1:  # nothing to check or share: a group of one pays no collective
            return np.zeros((1, 1), dtype=np.int64) if sizes is None else sizes.reshape(1, 1)
        head = np.zeros(_HEAD + self.size, dtype=np.int64)
        head[:_HEAD] = (OPS.index(op), _name_code(table), self.calls, arg, self.step, int(failed))
        if sizes is not None:
            head[_HEAD:] = sizes
        mine = torch.from_numpy(head)
        everyone = [torch.empty_like(mine) for _ in range(self.size)]
        try:
            dist.all_gather(everyone, mine, group=self.group)
        except RuntimeError as e:
            raise self._fail(op, table, e) from e
        heads = torch.stack(everyone).numpy()
        wrong = np.flatnonzero((heads[:, :_SAME] != head[:_SAME]).any(axis=1))
        if wrong.size:
            names = [OPS[c] if 0 <= c < len(OPS) else "?" for c in heads[:, 0].tolist()]
            calls = ", ".join(
                f"rank {r}: call {heads[r, 2]} {names[r]} at step {heads[r, 4]}"
                for r in range(self.size)
            )
            raise CollectiveError(
                f"rank {self.rank}: the ranks are not in the same collective call ({calls}; "
                f"this rank is in call {self.calls} {op} of {table!r}). Every rank must make "
                "every collective call, in the same order, with the same arguments and at the "
                "same step (advance alike), with an empty batch if it has none"
            )
        refused = np.flatnonzero(heads[:, _SAME] != 0)
        if refused.size and not failed:
            raise CollectiveError(
                f"rank {self.rank}: rank {int(refused[0])} refused its input to the {op} of "
                f"{table or 'the database'!r} (its error says why); nothing changed"
            )
        return heads[:, _HEAD:]

    def all_to_all(
        self, data: np.ndarray, send: Int64Array, recv: Int64Array, op: str, table: str
    ) -> np.ndarray:
        """Send ``data[rows for rank j]`` (grouped by destination, ``send[j]`` rows each) to
        every rank j; returns what arrived, grouped by source (``recv[i]`` rows from rank i)."""
        if self.size == 1:
            return data
        src = torch.from_numpy(np.ascontiguousarray(data))
        return self.all_to_all_tensor(src, send, recv, op, table).numpy()

    def all_to_all_tensor(
        self, src: torch.Tensor, send: Int64Array, recv: Int64Array, op: str, table: str
    ) -> torch.Tensor:
        """``all_to_all`` of a torch tensor (any dtype, e.g. a bfloat16 payload): ``send[j]``
        rows of ``src`` to rank j, ``recv[i]`` rows from rank i."""
        if self.size == 1:
            return src
        out = torch.empty((int(recv.sum()), *src.shape[1:]), dtype=src.dtype)
        a, b = out, src
        if src.dtype in (torch.bfloat16, torch.float16):  # gloo moves neither: send the bytes
            a = out.reshape(out.shape[0], -1).view(torch.uint8)
            b = src.reshape(src.shape[0], -1).view(torch.uint8)
        try:
            dist.all_to_all_single(a, b, recv.tolist(), send.tolist(), group=self.group)
        except RuntimeError as e:
            raise self._fail(op, table, e) from e
        return out

    def all_sum(self, values: Int64Array, op: str, table: str = "") -> Int64Array:
        """The element-wise sum of an int64 vector over every rank."""
        if self.size == 1:
            return np.asarray(values, dtype=np.int64)
        t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64).copy())
        try:
            dist.all_reduce(t, group=self.group)
        except RuntimeError as e:
            raise self._fail(op, table, e) from e
        return t.numpy()

    def gather_objects(self, obj: Any, op: str, table: str = "") -> list[Any]:
        """Every rank's (picklable, small) object, in rank order: configs, stats."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        try:
            dist.all_gather_object(out, obj, group=self.group)
        except RuntimeError as e:
            raise self._fail(op, table, e) from e
        return out

    def barrier(self, op: str, table: str = "") -> None:
        if self.size == 1:
            return
        try:
            dist.barrier(group=self.group)
        except RuntimeError as e:
            raise self._fail(op, table, e) from e
