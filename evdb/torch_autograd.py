"""The autograd functions of the PyTorch binding (``evdb.torch``): forward pulls a batch's rows
and combines them into bags; backward turns the bags' gradients into per-key gradients and
pushes them, which applies the table's fused optimizer in place. One function per table
(``embed``), or one for every table of a sharded collection, so that all its tables cross the
network in one exchange a step (``embed_grouped``).

A table whose top tier is on a CUDA device (``hbm_rows=N, device=D``) and a module input on
that device take the device path (``evdb.tiers.device_path``): keys, weights and gradients
go in and embeddings come out through DLPack (``cupy.from_dlpack`` of the tensors,
``torch.from_dlpack`` of the results), so rows and gradients stay on the device; the keys'
bookkeeping (dedup, admission) still runs on the host, 8 bytes a key. Anywhere else the
table answers in host arrays and ``on_device_of`` moves the combined bags once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.dlpack import from_dlpack as tensor_from_dlpack

from evdb.bags import Bags, parse_bags
from evdb.distributed.group import ShardedCollection
from evdb.distributed.table import ShardedTable
from evdb.pulled import Pulled
from evdb.table import Table
from evdb.tiers.device_path import DevicePath

__all__ = ["AnyTable", "embed", "embed_grouped", "on_device_of"]

AnyTable = Table | ShardedTable  # what the modules take: a table, or a sharded one
_DL_CPU, _DL_CUDA = 1, 2  # DLPack's device types (DLDeviceType kDLCPU, kDLCUDA)


class _PullCombine(torch.autograd.Function):
    """forward: pull + combine; backward: combine backward + push (one per call)."""

    @staticmethod
    def forward(
        ctx: Any,
        anchor: torch.Tensor,
        weights: torch.Tensor | None,
        table: AnyTable,
        keys: Any,
        offsets: np.ndarray,
        mode: str,
        max_norm: float | None,
        sync: Any,
        dp: DevicePath | None,
    ) -> torch.Tensor:
        # the bag arguments are checked before the pull changes anything, and parsed once for
        # the forward and the backward
        if dp is None:
            w = None if weights is None else weights.detach().to(torch.float32).cpu().numpy()
            bags = parse_bags(keys.shape[0], offsets, w, mode, max_norm)
        else:
            bags = dp.bags(keys.shape[0], offsets, _to_device(weights), mode, max_norm)
        pulled = table.pull(keys)
        ctx.state = (table, pulled, bags, offsets, max_norm, sync, dp)
        return _to_torch(pulled.combine_bags(bags), dp)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        table, pulled, bags, offsets, max_norm, sync, dp = ctx.state
        g32 = grad_out.detach().to(torch.float32).contiguous()
        g = g32.cpu().numpy() if dp is None else _to_device(g32)
        grads = pulled.combine_backward_bags(g, bags)
        sync(table)
        table.push(pulled, grads)
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = _to_torch(_weight_grad(pulled, g, offsets, max_norm), dp)
        return (None, grad_w, None, None, None, None, None, None, None)


def _to_device(t: torch.Tensor | None) -> Any:
    """A tensor on the table's device as a device array, sharing its memory (DLPack)."""
    if t is None:
        return None
    import cupy

    return cupy.from_dlpack(t.detach().contiguous())


def _to_torch(x: Any, dp: DevicePath | None) -> torch.Tensor:
    """A result as a tensor without a copy: host arrays by numpy, device ones by DLPack."""
    return torch.from_numpy(x) if dp is None else tensor_from_dlpack(x)


def _weight_grad(pulled: Pulled, grad_out: Any, offsets: np.ndarray, max_norm: float | None) -> Any:
    """d loss / d per_sample_weights for mode "sum": <x_p, grad_out[bag of p]> (on the
    device, for a batch pulled there: only the positions' indices go up)."""
    n = pulled.inverse.shape[0]
    bounds = np.append(offsets, n)
    bag_of = np.repeat(np.arange(bounds.shape[0] - 1), np.diff(bounds))
    inverse: Any = pulled.inverse
    xp: Any = np
    if pulled.on_device is not None:
        xp = pulled.on_device.path.cp
        inverse = pulled.on_device.inverse()
        bag_of = pulled.on_device.path.keys_to_device(bag_of)
    x = pulled.rows[inverse].astype(np.float64)
    if max_norm is not None:
        norm = xp.sqrt((x * x).sum(axis=1, keepdims=True))
        x = xp.where(norm > max_norm, x * max_norm / (norm + 1e-7), x)
    return (x * grad_out[bag_of]).sum(axis=1).astype(np.float32)


def device_path_for(table: AnyTable, like: Any) -> DevicePath | None:
    """The table's device path where the module's input lives where the table's device
    arrays do (DLPack's device tag: a CUDA tensor on the tier's device); None otherwise."""
    dp = getattr(table, "device_path", None)
    if dp is None or not isinstance(like, torch.Tensor):
        return None
    kind, index = (int(x) for x in dp.dlpack_device)
    if kind == _DL_CPU:  # arrays in host memory (the CI stand-in's): a CPU tensor is there
        return dp if like.device.type == "cpu" else None
    on = like.device.type == "cuda" and like.device.index == index
    return dp if kind == _DL_CUDA and on else None


def _device_keys(dp: DevicePath, keys: np.ndarray) -> Any:
    """The keys, which the module's input conventions resolved on the host (padding, a
    collection's features concatenated), as a device array: 8 bytes a key, counted."""
    return dp.keys_to_device(np.ascontiguousarray(keys, dtype=np.int64))


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
    like: Any = None,
) -> torch.Tensor:
    """The bags' embeddings (B, dim): pulled and pushed in training, looked up otherwise;
    on the device of ``like`` (the module's input), through the table's device path where
    it has one there (see the module docstring)."""
    out: torch.Tensor
    dp = device_path_for(table, like)
    if dp is not None:
        keys = _device_keys(dp, keys)
    if training and torch.is_grad_enabled():
        out = _PullCombine.apply(  # type: ignore[no-untyped-call]
            anchor, weights, table, keys, offsets, mode, max_norm, sync, dp
        )
    elif dp is None:  # inference: no counting, no row creation, no gradient
        w = None if weights is None else weights.detach().to(torch.float32).cpu().numpy()
        out = torch.from_numpy(table.lookup(keys, offsets, w, mode, max_norm))
    else:
        w = None if weights is None else _to_device(weights.to(torch.float32))
        out = tensor_from_dlpack(table.lookup(keys, offsets, w, mode, max_norm))
    if torch.is_autocast_enabled(out.device.type):
        out = out.to(torch.get_autocast_dtype(out.device.type))
    return on_device_of(out, like)


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
