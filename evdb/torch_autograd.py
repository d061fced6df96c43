"""The autograd functions of the PyTorch binding (``evdb.torch``): forward pulls a batch's rows
and combines them into bags; backward turns the bags' gradients into per-key gradients and
pushes them, which applies the table's fused optimizer in place. One function per table
(``embed``), or one for every table of a sharded collection, so that all its tables cross the
network in one exchange a step (``embed_grouped``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from evdb.bags import Bags, parse_bags
from evdb.distributed.group import ShardedCollection
from evdb.distributed.table import ShardedTable
from evdb.pulled import Pulled
from evdb.table import Table

__all__ = ["AnyTable", "embed", "embed_grouped", "on_device_of"]

AnyTable = Table | ShardedTable  # what the modules take: a table, or a sharded one


class _PullCombine(torch.autograd.Function):
    """forward: pull + combine; backward: combine backward + push (one per call)."""

    @staticmethod
    def forward(
        ctx: Any,
        anchor: torch.Tensor,
        weights: torch.Tensor | None,
        table: AnyTable,
        keys: np.ndarray,
        offsets: np.ndarray,
        mode: str,
        max_norm: float | None,
        sync: Any,
    ) -> torch.Tensor:
        w = None if weights is None else weights.detach().to(torch.float32).cpu().numpy()
        # the bag arguments are checked before the pull changes anything, and parsed once for
        # the forward and the backward
        bags = parse_bags(keys.shape[0], offsets, w, mode, max_norm)
        pulled = table.pull(keys)
        ctx.state = (table, pulled, bags, offsets, max_norm, sync)
        return torch.from_numpy(pulled.combine_bags(bags))

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        table, pulled, bags, offsets, max_norm, sync = ctx.state
        g = grad_out.detach().to(torch.float32).contiguous().cpu().numpy()
        grads = pulled.combine_backward_bags(g, bags)
        sync(table)
        table.push(pulled, grads)
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = torch.from_numpy(_weight_grad(pulled, g, offsets, max_norm))
        return (None, grad_w, None, None, None, None, None, None)


def _weight_grad(
    pulled: Pulled, grad_out: np.ndarray, offsets: np.ndarray, max_norm: float | None
) -> np.ndarray:
    """d loss / d per_sample_weights for mode "sum": <x_p, grad_out[bag of p]>."""
    n = pulled.inverse.shape[0]
    bounds = np.append(offsets, n)
    bag_of = np.repeat(np.arange(bounds.shape[0] - 1), np.diff(bounds))
    x = pulled.rows[pulled.inverse].astype(np.float64)
    if max_norm is not None:
        norm = np.linalg.norm(x, axis=1, keepdims=True)
        x = np.where(norm > max_norm, x * max_norm / (norm + 1e-7), x)
    grad_w: np.ndarray = (x * grad_out[bag_of]).sum(axis=1).astype(np.float32)
    return grad_w


@torch.compiler.disable  # type: ignore[untyped-decorator]
def embed(
    anchor: torch.Tensor,
    training: bool,
    table: AnyTable,
    keys: np.ndarray,
    offsets: np.ndarray,
    weights: torch.Tensor | None,
    mode: str,
    max_norm: float | None,
    sync: Any,
) -> torch.Tensor:
    out: torch.Tensor
    if training and torch.is_grad_enabled():
        out = _PullCombine.apply(  # type: ignore[no-untyped-call]
            anchor, weights, table, keys, offsets, mode, max_norm, sync
        )
    else:  # inference: no counting, no row creation, no gradient
        w = None if weights is None else weights.detach().to(torch.float32).cpu().numpy()
        out = torch.from_numpy(table.lookup(keys, offsets, w, mode, max_norm))
    if torch.is_autocast_enabled("cpu"):
        out = out.to(torch.get_autocast_dtype("cpu"))
    return out


def on_device_of(out: torch.Tensor, like: Any) -> torch.Tensor:
    """out on the device of ``like`` (a module's input): a CUDA batch gets CUDA embeddings.

    One copy of the combined bags (B, dim), not of the rows: the table answers in host
    arrays (an HBM tier's rows cross its boundary through pinned staging), so the bags are
    combined on the host and moved once; autograd carries their gradient back through the
    copy to the push. A str table's keys (not a tensor) leave out where it is.
    """
    if isinstance(like, torch.Tensor) and like.device != out.device:
        return out.to(like.device)
    return out


class _GroupPullCombine(torch.autograd.Function):
    """forward: one grouped pull of every table + each table's combine; backward: each
    table's combine backward + one grouped push (``ShardedCollection``)."""

    @staticmethod
    def forward(
        ctx: Any,
        anchor: torch.Tensor,
        coll: ShardedCollection,
        batch: dict[str, tuple[np.ndarray, np.ndarray, Bags]],
        sync: Any,
        *weights: torch.Tensor | None,
    ) -> tuple[torch.Tensor, ...]:
        pulled = coll.pull({name: keys for name, (keys, _, _) in batch.items()})
        ctx.state = (coll, pulled, batch, sync)
        return tuple(torch.from_numpy(pulled[n].combine_bags(b)) for n, (_, _, b) in batch.items())

    @staticmethod
    def backward(ctx: Any, *grad_outs: torch.Tensor) -> tuple[Any, ...]:
        coll, pulled, batch, sync = ctx.state
        grads: dict[str, np.ndarray] = {}
        grad_ws: list[torch.Tensor | None] = []
        for i, (name, (_, offsets, bags)) in enumerate(batch.items()):
            g = grad_outs[i].detach().to(torch.float32).contiguous().cpu().numpy()
            grads[name] = pulled[name].combine_backward_bags(g, bags)
            grad_w = None
            if ctx.needs_input_grad[4 + i]:
                grad_w = torch.from_numpy(_weight_grad(pulled[name], g, offsets, bags.max_norm))
            grad_ws.append(grad_w)
        for name, table in coll.tables.items():
            sync(table)
            if name not in grads:  # a table no feature of this batch used: nothing to send
                grads[name] = np.empty((0, table.dim), dtype=np.float32)
        coll.push(pulled, grads)
        return (None, None, None, None, *grad_ws)


@torch.compiler.disable  # type: ignore[untyped-decorator]
def embed_grouped(
    anchor: torch.Tensor,
    training: bool,
    coll: ShardedCollection,
    batch: dict[str, tuple[np.ndarray, np.ndarray, torch.Tensor | None]],
    mode: str,
    max_norm: float | None,
    sync: Any,
) -> dict[str, torch.Tensor]:
    """Every table's bags through one grouped exchange (training), or per-table lookups."""
    if not (training and torch.is_grad_enabled()):
        return {
            name: embed(anchor, training, coll.tables[name], k, off, w, mode, max_norm, sync)
            for name, (k, off, w) in batch.items()
        }
    parsed, weights = {}, []
    for name, (keys, offsets, w) in batch.items():
        wn = None if w is None else w.detach().to(torch.float32).cpu().numpy()
        # every table's bag arguments are checked before the pull changes anything
        parsed[name] = (keys, offsets, parse_bags(keys.shape[0], offsets, wn, mode, max_norm))
        weights.append(w)
    outs = _GroupPullCombine.apply(  # type: ignore[no-untyped-call]
        anchor, coll, parsed, sync, *weights
    )
    result = dict(zip(batch, outs, strict=True))
    if torch.is_autocast_enabled("cpu"):
        result = {n: o.to(torch.get_autocast_dtype("cpu")) for n, o in result.items()}
    return result
