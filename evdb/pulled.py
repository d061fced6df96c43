"""``Pulled``: the rows of one training batch, and the bag combine of the training path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evdb._types import BoolArray, Float32Array, Int64Array
from evdb.arrays import float_matrix
from evdb.bags import Bags, parse_bags
from evdb.kernels import backend

cpu = backend("cpu")  # bound once: a call costs one attribute lookup

__all__ = ["Pulled"]


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
    # Where the rows were: push reuses them while the tier has freed nothing since (no re-probe).
    _rows: Int64Array = field(default_factory=lambda: np.empty(0, np.int64), repr=False)
    _tier: object = field(default=None, repr=False)
    _frees: int = field(default=-1, repr=False)
    # The table's count of pulls when this one was made: push accepts only the latest pull
    # of a table, once (Table._check_pushable).
    _serial: int = field(default=-1, repr=False)

    def combine(
        self,
        offsets: Any,
        weights: Any = None,
        combiner: str | None = None,
        max_norm: float | None = None,
    ) -> Float32Array:
        """Combine the batch's rows into bags: (B, dim) float32.

        Same arguments as ``Table.lookup``: ``offsets`` (B,) start of each bag in the keys given
        to ``pull`` (torch.nn.EmbeddingBag's convention), per-key ``weights`` (n,),
        ``combiner`` "sum" | "mean" (default) | "sqrtn", ``max_norm`` clipping each row first.
        """
        return self._combine(
            parse_bags(self.inverse.shape[0], offsets, weights, combiner, max_norm)
        )

    def _combine(self, bags: Bags) -> Float32Array:
        """``combine`` with its arguments already parsed (the torch binding parses them once
        for the forward and the backward of a step)."""
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
        bags = parse_bags(self.inverse.shape[0], offsets, weights, combiner, max_norm)
        return self._combine_backward(grad_out, bags)

    def _combine_backward(self, grad_out: Any, bags: Bags) -> Float32Array:
        """``combine_backward`` with the bag arguments already parsed."""
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
