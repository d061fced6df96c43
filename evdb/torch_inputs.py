"""The inputs of the PyTorch binding's modules: torch.nn.EmbeddingBag's conventions (1-D
input with offsets, 2-D input, ``include_last_offset``, ``padding_idx``, per-sample weights)
and a ``key_type="str"`` table's keys given as strings, turned into keys, offsets and weights
for ``evdb.torch_autograd.embed``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from evdb.bags import parse_offsets
from evdb.torch_autograd import AnyTable

__all__ = ["bags_of", "keys_array", "str_bags_of"]


def keys_array(values: torch.Tensor, name: str) -> np.ndarray:
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(values).__name__}")
    if values.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"{name} must be an integer tensor, got {values.dtype}")
    return values.detach().cpu().numpy().astype(np.int64, copy=False).reshape(-1)


def str_bags_of(
    table: AnyTable,
    input: Any,
    offsets: torch.Tensor | None,
    per_sample_weights: torch.Tensor | None,
    include_last_offset: bool,
) -> tuple[np.ndarray, np.ndarray, torch.Tensor | None]:
    """A sequence of str keys (what a ``key_type="str"`` table takes) with its offsets ->
    (keys (n,) object, offsets (B,), weights): the table hashes the strings (and keeps them,
    with ``keep_strings``), as its own ``pull`` and ``lookup`` do."""
    if table.config.key_type != "str":
        raise TypeError(
            f"input must be a torch.Tensor of int keys for table {table.name!r} "
            f"(key_type={table.config.key_type!r}), got {type(input).__name__}"
        )
    if isinstance(input, str) or not isinstance(input, (list, tuple, np.ndarray)):
        raise TypeError(f"input must be a sequence of str keys, got {type(input).__name__}")
    keys = np.empty(len(input), dtype=object)
    keys[:] = list(input)
    if offsets is None:
        raise ValueError("offsets has to be a 1D Tensor but got None")
    off = keys_array(torch.as_tensor(offsets), "offsets")
    if include_last_offset:
        if off.shape[0] == 0:
            raise ValueError("include_last_offset needs at least one offset")
        off = off[:-1]
    weights = None
    if per_sample_weights is not None:
        if per_sample_weights.shape != (keys.shape[0],):
            raise ValueError(
                f"embedding_bag: per_sample_weights ({tuple(per_sample_weights.shape)}) must "
                f"have the shape of the input ({keys.shape[0]},)"
            )
        weights = per_sample_weights
    return keys, off, weights


def bags_of(
    input: torch.Tensor,
    offsets: torch.Tensor | None,
    per_sample_weights: torch.Tensor | None,
    include_last_offset: bool,
    padding_idx: int | None,
) -> tuple[np.ndarray, np.ndarray, torch.Tensor | None]:
    """torch.nn.EmbeddingBag's input conventions -> (keys (n,), offsets (B,), weights)."""
    if input.dim() == 2:
        if offsets is not None:
            raise ValueError(
                "if input is 2D, then offsets has to be None, as input is treated is a "
                "mini-batch of fixed length sequences. However, found offsets of type "
                f"{type(offsets)}"
            )
        n_bags, length = input.shape
        off = np.arange(0, n_bags * length, length, dtype=np.int64)
    elif input.dim() == 1:
        if offsets is None:
            raise ValueError("offsets has to be a 1D Tensor but got None")
        if offsets.dim() != 1:
            raise ValueError("offsets has to be a 1D Tensor")
        off = keys_array(offsets, "offsets")
        if include_last_offset:
            if off.shape[0] == 0:
                raise ValueError("include_last_offset needs at least one offset")
            off = off[:-1]
    else:
        raise ValueError(
            f"input has to be 1D or 2D Tensor, but got Tensor of dimension {input.dim()}"
        )
    if per_sample_weights is not None and per_sample_weights.shape != input.shape:
        raise ValueError(
            f"embedding_bag: If per_sample_weights ({per_sample_weights.shape}) is not None, "
            f"then it must have the same shape as the input ({input.shape})"
        )
    keys = keys_array(input, "input")
    weights = None if per_sample_weights is None else per_sample_weights.reshape(-1)
    if padding_idx is not None:  # padding positions leave their bags (and the mean's count)
        keep = keys != padding_idx
        if not keep.all():
            parse_offsets(off, keys.shape[0])  # valid before they are remapped
            kept_before = np.concatenate([[0], np.cumsum(keep)])
            off = kept_before[off]
            keys = keys[keep]
            if weights is not None:
                weights = weights[torch.from_numpy(keep)]
    return keys, off, weights
