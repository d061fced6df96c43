"""``Pulled``: the rows of one training batch, and the bag combine of the training path."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evdb._types import BoolArray, Float32Array, Int64Array
from evdb.arrays import float_matrix
from evdb.bags import Bags, parse_bags
from evdb.errors import InvalidArgumentError
from evdb.kernels import backend
from evdb.tiers.device_path import DeviceBatch

cpu = backend("cpu")  # bound once: a call costs one attribute lookup

__all__ = ["SAME_STEP_PUSHES", "PullLedger", "Pulled", "Ticket"]

SAME_STEP_PUSHES = 1000  # a table with a TTL warns once when it takes this many at one step


@dataclass(frozen=True)
class Ticket:
    """What the table that made a pull keeps about it, for its push.

    ``rows``: where the batch's rows were in the top tier, reused by the push while ``frees``
    still equals the tier's (no row was freed since: no re-probe). ``serial``: the table's
    count of pulls before this one; a push accepts only the latest pull of a table, once.
    ``owner``: the table's ledger, so that a batch is pushed to the table that pulled it."""

    rows: Int64Array
    frees: int
    serial: int
    owner: PullLedger


class PullLedger:
    """A table's pulls and pushes: a push applies to the latest pull, once (TorchRec and
    DeepRec tie an update to its lookup the same way); pulls that the next pull finds not
    pushed are counted; with a TTL, pushes piled up at one step warn once."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.pulls = 0  # pulls made
        self.pushed = -1  # serial of the last pull pushed
        self._push_step = -1
        self._pushes_at_step = 0
        self._warned_step = False

    def pulled(self) -> tuple[int, bool]:
        """A pull is made: its serial, and whether the one before was never pushed."""
        missed = self.pulls > 0 and self.pushed != self.pulls - 1
        self.pulls += 1
        return self.pulls - 1, missed

    def check(self, pulled: Any) -> Ticket:
        """Raise ``InvalidArgumentError`` unless pulled is this table's latest pull, not
        pushed yet: a second push would apply its gradients twice, and a batch older than the
        last pull was computed from rows that pull may have unpinned and moved."""
        name = self.table
        if not isinstance(pulled, Pulled) or pulled.table != name or pulled.ticket is None:
            raise InvalidArgumentError(
                f"pulled must be what {name!r}.pull() returned, got {type(pulled).__name__}"
                + (f" of table {pulled.table!r}" if isinstance(pulled, Pulled) else "")
            )
        ticket = pulled.ticket
        if ticket.owner is not self:
            raise InvalidArgumentError(
                f"pulled: this batch was pulled from another table {name!r} (one dropped "
                "and re-created, or another database): push it to the table that pulled it"
            )
        if ticket.serial <= self.pushed:
            raise InvalidArgumentError(
                f"pulled: this batch of table {name!r} was pushed already (pull "
                f"#{ticket.serial}); a second push would apply its gradients twice"
            )
        if ticket.serial != self.pulls - 1:
            raise InvalidArgumentError(
                f"pulled: this batch of table {name!r} (pull #{ticket.serial}) is stale: "
                f"pull #{self.pulls - 1} came after it and unpinned its rows; push each batch "
                "before the next pull of the table (to accumulate gradients over micro-batches, "
                "sum them and push once)"
            )
        return ticket

    def pushing(self, ticket: Ticket, step: int, ttl_steps: int | None) -> None:
        """A push of the batch is applied at ``step``. With a TTL, warn once when pushes pile
        up at one step: a loop that never calls ``advance`` expires nothing, then everything
        at once when the step jumps."""
        self.pushed = ticket.serial
        if ttl_steps is None:
            return
        if step != self._push_step:
            self._push_step, self._pushes_at_step = step, 0
        self._pushes_at_step += 1
        if self._pushes_at_step == SAME_STEP_PUSHES and not self._warned_step:
            self._warned_step = True
            warnings.warn(
                f"table {self.table!r} has ttl_steps={ttl_steps} but took "
                f"{SAME_STEP_PUSHES} pushes at step {step}: call db.advance() once per "
                "training step, or its rows expire by steps that never come (and then all at "
                "once)",
                RuntimeWarning,
                stacklevel=5,
            )


@dataclass(frozen=True, eq=False)
class Pulled:
    """What ``Table.pull`` returns: the batch's distinct keys and their rows.

    A batch of n = 5 keys in B = 2 bags (offsets [0, 3]) with u = 3 distinct keys::

        keys given to pull   [ 7, 9, 7 | 4, 9 ]
        keys     (u,) int64  [ 7, 9, 4 ]          first-occurrence order
        inverse  (n,) int64  [ 0, 1, 0, 2, 1 ]    keys[inverse] == the keys given
        counts   (u,) int64  [ 2, 2, 1 ]
        rows     (u, dim)    row values (the default value where not admitted)
        admitted (u,) bool   which keys have a row (push drops gradients of the others)

    A ``Pulled`` is pushed once, before the table's next ``pull`` (see ``Table.push``).

        combine(offsets=[0, 3])           -> (B, dim): mean of rows[[0, 1, 0]], of rows[[2, 1]]
        combine_backward(g, offsets=...)  -> (u, dim): gradients to pass to Table.push

    Examples
    --------
    >>> import tempfile, numpy as np, evdb
    >>> db = evdb.open(tempfile.mkdtemp())
    >>> t = db.create_table("t", dim=2, initializer=evdb.init.Ones())
    >>> p = t.pull([7, 9, 7, 4, 9])
    >>> p.combine([0, 3], combiner="sum").tolist()
    [[3.0, 3.0], [2.0, 2.0]]
    >>> p.combine_backward(np.ones((2, 2)), [0, 3], combiner="sum").tolist()
    [[2.0, 2.0], [2.0, 2.0], [1.0, 1.0]]
    >>> db.close()
    """

    keys: Int64Array
    inverse: Int64Array
    rows: Float32Array
    admitted: BoolArray
    counts: Int64Array
    step: int
    table: str
    # The table's bookkeeping of this batch, for its push (where its rows were, its serial)
    ticket: Ticket | None = field(default=None, repr=False)
    # A batch pulled with device keys: rows is a device array, combined on the device
    on_device: DeviceBatch | None = field(default=None, repr=False)

    def combine(
        self,
        offsets: Any,
        weights: Any = None,
        combiner: str | None = None,
        max_norm: float | None = None,
    ) -> Float32Array:
        """Combine the batch's rows into bags: (B, dim) float32 (a device array for a batch
        pulled with device keys; then ``weights`` must be on the device too).

        Same arguments as ``Table.lookup``: ``offsets`` (B,) start of each bag in the keys given
        to ``pull`` (torch.nn.EmbeddingBag's convention), per-key ``weights`` (n,),
        ``combiner`` "sum" | "mean" (default) | "sqrtn", ``max_norm`` clipping each row first.
        """
        n = self.inverse.shape[0]
        if self.on_device is not None:
            bags = self.on_device.path.bags(n, offsets, weights, combiner, max_norm)
        else:
            bags = parse_bags(n, offsets, weights, combiner, max_norm)
        return self.combine_bags(bags)

    def combine_bags(self, bags: Bags) -> Float32Array:
        """``combine`` with its arguments already parsed (the torch binding parses them once
        for the forward and the backward of a step)."""
        if self.on_device is not None:
            combined: Float32Array = self.on_device.combine(self.rows, bags)
            return combined
        out = np.empty((bags.n_bags, self.rows.shape[1]), dtype=np.float32)
        cpu.gather_combine(
            self.rows, self.inverse, bags.bounds, bags.weights, bags.combiner, bags.max_norm, out
        )
        return out

    def combine_backward(
        self,
        grad_out: Any,
        offsets: Any,
        weights: Any = None,
        combiner: str | None = None,
        max_norm: float | None = None,
    ) -> Float32Array:
        """Gradient of ``combine`` with respect to ``rows``: (u, dim) float32, aligned with
        ``keys``, ready for ``Table.push``. ``grad_out`` (B, dim) is d loss / d combine(...);
        the other arguments must be those given to ``combine``."""
        n = self.inverse.shape[0]
        if self.on_device is not None:
            bags = self.on_device.path.bags(n, offsets, weights, combiner, max_norm)
        else:
            bags = parse_bags(n, offsets, weights, combiner, max_norm)
        return self.combine_backward_bags(grad_out, bags)

    def combine_backward_bags(self, grad_out: Any, bags: Bags) -> Float32Array:
        """``combine_backward`` with the bag arguments already parsed."""
        if self.on_device is not None:
            grads: Float32Array = self.on_device.combine_backward(grad_out, self.rows, bags)
            return grads
        g = float_matrix(grad_out, (bags.n_bags, self.rows.shape[1]), "grad_out")
        out = np.empty_like(self.rows)
        cpu.combine_backward(
            g,
            self.rows,
            self.inverse,
            bags.bounds,
            bags.weights,
            bags.combiner,
            bags.max_norm,
            out,
        )
        return out
