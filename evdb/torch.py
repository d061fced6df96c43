"""The PyTorch binding: modules that stand where ``torch.nn.EmbeddingBag`` or TorchRec's
``EmbeddingBagCollection`` stood, with the rows in evdb tables.

In ``train()`` mode with gradients enabled, forward pulls the batch's rows (admission counts,
rows are created) and combines them; backward turns the output gradient into per-key
gradients and pushes them, which applies the table's fused optimizer to the rows in place. In
``eval()`` mode, or under ``torch.no_grad()``, forward is a ``lookup``: no counting, no row
creation, no gradient. The user's torch optimizer covers only dense parameters::

    emb = EmbeddingBag(db.table("item"), mode="mean")
    dense_opt = torch.optim.Adam(mlp.parameters())
    for batch in loader:
        out = mlp(emb(batch.ids, batch.offsets))     # pull + combine
        loss = loss_fn(out, batch.label)
        dense_opt.zero_grad()
        loss.backward()                              # combine backward + push (rows updated)
        dense_opt.step()
        db.advance()                                 # one global step per batch: TTL, ageing

Differences from ``torch.nn.EmbeddingBag``: there is no ``num_embeddings`` (any int64 key is
valid, and a key without a row reads its default value); ``mode`` adds ``"sqrtn"`` and has no
``"max"``; ``max_norm`` scales looked-up rows but never rewrites the stored ones; only
``norm_type=2``. The module holds no parameters: ``state_dict()`` carries the table name and
config, and the rows are saved with the database. Under ``torch.compile`` the evdb call is a
graph break (``torch.compiler.disable``): the model compiles around it.

Over sharded tables (``evdb.distributed``), ``EmbeddingBagCollection`` pulls and pushes all of
its tables in one grouped exchange a step (``evdb.distributed.ShardedCollection``), with
float32, bfloat16 or float16 payloads (``payload_dtype``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from evdb.distributed.group import PAYLOAD_DTYPES, ShardedCollection
from evdb.distributed.table import ShardedTable
from evdb.table import Table
from evdb.torch_autograd import AnyTable, embed, embed_grouped
from evdb.torch_inputs import bags_of, keys_array, str_bags_of

__all__ = ["EmbeddingBag", "EmbeddingBagCollection", "FusedOptimizer"]

_MODES = ("sum", "mean", "sqrtn")


class FusedOptimizer(torch.optim.Optimizer):
    """The tables' own optimizers, seen as one ``torch.optim.Optimizer``.

    One param group per table, ``{"lr": ..., "table": name}``: a torch LR scheduler that
    changes a group's ``lr`` changes the table's learning rate from the next push on.
    ``step()`` and ``zero_grad()`` do nothing, because the update happens inside backward.
    """

    def __init__(self, tables: Mapping[str, AnyTable]) -> None:
        self._tables = dict(tables)
        groups = [
            {"params": [torch.zeros(())], "lr": t.learning_rate, "table": name}
            | {"applied_lr": t.learning_rate}  # the lr sync last applied to the table
            for name, t in self._tables.items()
        ]
        super().__init__(groups, {"lr": 0.0})

    def sync(self, table: AnyTable) -> None:
        """Apply the param group's lr to the table (called before each push) if it changed
        since the last push (a scheduler); else the group takes the table's, which a restore
        may have changed (``evdb.torch_checkpoint``)."""
        for group in self.param_groups:
            if self._tables.get(group["table"]) is not table:
                continue
            if group["lr"] != group.get("applied_lr", table.learning_rate):
                table.learning_rate = float(group["lr"])
            elif group["lr"] != table.learning_rate:
                group["lr"] = table.learning_rate
            group["applied_lr"] = group["lr"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


class EmbeddingBag(nn.Module):
    """``torch.nn.EmbeddingBag`` over an evdb table.

    Parameters
    ----------
    table : evdb.Table
        Where the rows live; several modules may share one table. A ``key_type="str"``
        table also takes its keys as a sequence of str (``emb(["a", "b"], offsets)``):
        the table hashes them, and keeps them with ``keep_strings``.
    mode : "sum" | "mean" | "sqrtn"
        How each bag is combined (torch's default is "mean").
    max_norm : float, optional
        Looked-up rows are scaled to at most this L2 norm (the stored rows are not changed).
    norm_type : float
        Only 2.0 (the L2 norm) is supported.
    include_last_offset, padding_idx
        As in torch.nn.EmbeddingBag; ``padding_idx`` is a key that bags skip.

    Examples
    --------
    >>> import tempfile, torch, evdb
    >>> from evdb.torch import EmbeddingBag
    >>> db = evdb.open(tempfile.mkdtemp())
    >>> emb = EmbeddingBag(db.create_table("item", dim=4), mode="sum")
    >>> out = emb(torch.tensor([7, 9, 7, 4]), torch.tensor([0, 3]))   # bags [7, 9, 7] and [4]
    >>> out.shape, out.requires_grad
    (torch.Size([2, 4]), True)
    >>> out.sum().backward()            # pushes the gradients: the rows are updated in place
    >>> db.close()
    """

    def __init__(
        self,
        table: AnyTable,
        mode: str = "mean",
        max_norm: float | None = None,
        norm_type: float = 2.0,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(table, Table | ShardedTable):
            raise TypeError(
                f"table must be an evdb.Table or a sharded table, got {type(table).__name__}"
            )
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        if norm_type != 2.0:
            raise ValueError(f"norm_type must be 2.0 (evdb clips by L2 norm), got {norm_type}")
        self.table = table
        self.mode = mode
        self.max_norm = max_norm
        self.include_last_offset = include_last_offset
        self.padding_idx = padding_idx
        self.embedding_dim = table.dim
        # A tensor that requires grad, so autograd calls our backward even when nothing
        # upstream of the keys does; not a Parameter, so no torch optimizer sees it.
        self._anchor = torch.zeros((), requires_grad=True)
        self.fused_optimizer = FusedOptimizer({table.name: table})

    def forward(
        self,
        input: torch.Tensor,
        offsets: torch.Tensor | None = None,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if per_sample_weights is not None and self.mode != "sum":
            raise NotImplementedError(
                "embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                f"supported for mode='sum' (got mode='{self.mode}')."
            )
        if isinstance(input, torch.Tensor):
            keys, off, weights = bags_of(
                input, offsets, per_sample_weights, self.include_last_offset, self.padding_idx
            )
        else:  # the keys of a key_type="str" table, as strings: the table hashes them
            keys, off, weights = str_bags_of(
                self.table, input, offsets, per_sample_weights, self.include_last_offset
            )
        out: torch.Tensor = embed(
            self._anchor,
            self.training,
            self.table,
            keys,
            off,
            weights,
            self.mode,
            self.max_norm,
            self.fused_optimizer.sync,
            like=input,  # embeddings on the input's device (the table's device path there)
        )
        return out

    def get_extra_state(self) -> dict[str, Any]:
        """The table's name and config: the rows are the database's, saved with it."""
        return {"table": self.table.name, "config": self.table.config.to_dict()}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        if state.get("table") != self.table.name:
            raise ValueError(
                f"state_dict is for table {state.get('table')!r}, this module has "
                f"{self.table.name!r}"
            )

    def extra_repr(self) -> str:
        return f"table={self.table.name!r}, dim={self.embedding_dim}, mode={self.mode!r}"


def _check_stackable(
    feats: dict[str, tuple[np.ndarray, np.ndarray, Any]], tables: Mapping[str, AnyTable]
) -> None:
    """stack=True: every feature has as many bags (offsets) and the same dim as the first."""
    shapes = {name: (off.shape[0], tables[name].dim) for name, (_, off, _) in feats.items()}
    first, (b0, d0) = next(iter(shapes.items()), ("", (0, 0)))
    for name, (b, d) in shapes.items():
        if (b, d) != (b0, d0):
            raise ValueError(
                f"stack=True needs every feature with the same bags and dim: features[{name!r}] "
                f"has {b} bags of dim {d}, features[{first!r}] {b0} of dim {d0}"
            )


class EmbeddingBagCollection(nn.Module):
    """Several features, each through a table, with one pull and one push per table per step
    (features sharing a table are looked up together), like TorchRec's EmbeddingBagCollection.

    ``forward(features)`` takes a dict ``name -> (values, offsets)`` or, by duck typing, a
    TorchRec ``KeyedJaggedTensor`` (``keys()``, ``values()``, ``offsets()`` or ``lengths()``,
    ``weights_or_none()``), and returns a dict ``name -> (B, dim)`` tensor, or, with
    ``concat=True``, one ``(B, sum of dims)`` tensor in feature order, or, with
    ``stack=True``, one ``(features, B, dim)`` tensor in feature order (every feature with the
    same B and dim). When one table holds every feature, the stacked tensor is the table's
    pooled output itself, as TorchRec's KeyedTensor holds its features in one tensor: no copy
    forward, and its gradient goes to the push whole (a dict's views cost a copy each way once
    the model stacks or concatenates them).

    Over sharded tables (of one sharded database), training pulls and pushes every table in
    one grouped exchange (``evdb.distributed.ShardedCollection``): 5 collectives a step
    whatever the number of tables, instead of 5 a table. ``grouped=False`` makes the
    per-table calls instead (the same tables, bit for bit). ``payload_dtype`` ("float32",
    "bfloat16" or "float16") is how the grouped exchange sends rows and gradients between
    ranks. A step's backward pushes every table of the collection once, as one call: a
    feature whose output took no part in the loss pushes zero gradients (Adam's moments
    still move its rows, as they would for any zero gradient).
    """

    def __init__(
        self,
        tables: Mapping[str, AnyTable],
        mode: str = "sum",
        max_norm: float | None = None,
        concat: bool = False,
        stack: bool = False,
        *,
        grouped: bool = True,
        payload_dtype: str = "float32",
    ) -> None:
        super().__init__()
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        if concat and stack:
            raise ValueError("concat and stack: choose one layout of the outputs, not both")
        for name, t in tables.items():
            if not isinstance(t, Table | ShardedTable):
                raise TypeError(
                    f"tables[{name!r}] must be an evdb.Table or a sharded table, got "
                    f"{type(t).__name__}"
                )
        if payload_dtype not in PAYLOAD_DTYPES:
            raise ValueError(
                f"payload_dtype must be one of {list(PAYLOAD_DTYPES)}, got {payload_dtype!r}"
            )
        self.tables = dict(tables)
        self.mode = mode
        self.max_norm = max_norm
        self.concat = concat
        self.stack = stack
        self._anchor = torch.zeros((), requires_grad=True)
        distinct = {t.name: t for t in self.tables.values()}
        self.fused_optimizer = FusedOptimizer(distinct)
        sharded = [t for t in distinct.values() if isinstance(t, ShardedTable)]
        self.collection: ShardedCollection | None = None
        if grouped and sharded and len(sharded) == len(distinct):
            self.collection = ShardedCollection(sharded, payload_dtype=payload_dtype)
        elif payload_dtype != "float32":
            raise ValueError(
                f"payload_dtype={payload_dtype!r} applies to the grouped exchange of sharded "
                "tables (grouped=True, every table sharded)"
            )

    @classmethod
    def from_configs(
        cls,
        db: Any,
        configs: Iterable[Any],
        *,
        concat: bool = False,
        stack: bool = False,
        **table_options: Any,
    ) -> EmbeddingBagCollection:
        """A collection from TorchRec's ``EmbeddingBagConfig`` list (or anything with their
        fields: ``name``, ``embedding_dim``, ``feature_names``, optional ``pooling``): one evdb
        table per config, named after it (created in ``db`` with ``table_options``, or the
        existing one of that name and dim), read by each of its features.
        ``num_embeddings`` is not needed (any int64 key is valid) and is ignored. Every
        config must pool alike (TorchRec's ``PoolingType.SUM`` or ``MEAN``: ``mode``)."""
        tables: dict[str, AnyTable] = {}
        modes = set()
        for i, c in enumerate(configs):
            name, dim, features = c.name, c.embedding_dim, list(c.feature_names)
            if not features:
                raise ValueError(f"configs[{i}] ({name!r}) has no feature_names")
            pooling = getattr(c, "pooling", None)
            modes.add(str(getattr(pooling, "name", pooling or "sum")).lower())
            table = db.table(name) if name in db.tables() else None
            if table is None:
                table = db.create_table(name, dim, **table_options)
            elif table.dim != dim:
                raise ValueError(
                    f"configs[{i}]: table {name!r} exists with dim {table.dim}, not {dim}"
                )
            for feature in features:
                if feature in tables:
                    raise ValueError(f"configs[{i}]: feature {feature!r} is in two configs")
                tables[feature] = table
        if not tables:
            raise ValueError("configs: no EmbeddingBagConfig given")
        if len(modes) != 1:
            raise ValueError(f"configs: every config must pool alike, got {sorted(modes)}")
        return cls(tables, mode=modes.pop(), concat=concat, stack=stack)

    def _features(self, features: Any) -> dict[str, tuple[np.ndarray, np.ndarray, Any]]:
        if (
            hasattr(features, "keys")
            and hasattr(features, "values")
            and callable(getattr(features, "weights_or_none", None))
        ):  # a KeyedJaggedTensor: values of all keys concatenated, one lengths run per key
            names = list(features.keys())
            values = keys_array(features.values(), "values")
            lengths = (
                features.lengths().detach().cpu().numpy().astype(np.int64)
                if features.lengths() is not None
                else np.diff(features.offsets().detach().cpu().numpy().astype(np.int64))
            )
            weights = features.weights_or_none()
            per_key = lengths.reshape(len(names), -1)
            out, start = {}, 0
            for name, lens in zip(names, per_key, strict=True):
                stop = start + int(lens.sum())
                off = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
                w = None if weights is None else weights[start:stop]
                out[name] = (values[start:stop], off, w)
                start = stop
            return out
        out = {}
        for name, item in dict(features).items():
            values, offsets = item[0], item[1]
            w = item[2] if len(item) > 2 else None
            out[name] = (
                keys_array(values, f"features[{name!r}] values"),
                keys_array(offsets, f"features[{name!r}] offsets"),
                w,
            )
        return out

    def forward(self, features: Any) -> dict[str, torch.Tensor] | torch.Tensor:
        feats = self._features(features)
        kjt = callable(getattr(features, "weights_or_none", None))
        like = features.values() if kjt else next(iter(dict(features).values()), (None,))[0]
        unknown = [name for name in feats if name not in self.tables]
        if unknown:
            raise KeyError(f"features: no table for {unknown[0]!r}; known: {sorted(self.tables)}")
        if self.stack:  # checked before anything is pulled
            _check_stackable(feats, self.tables)
        results: dict[str, torch.Tensor] = {}
        by_table: dict[str, list[str]] = {}
        for name in feats:
            by_table.setdefault(self.tables[name].name, []).append(name)
        # one pull and push per table: each table's features' bags, concatenated
        batch: dict[str, tuple[np.ndarray, np.ndarray, torch.Tensor | None]] = {}
        splits: dict[str, list[int]] = {}
        for table_name, names in by_table.items():
            if len(names) == 1:  # a table of its own: its bags as they are (no copy, no split)
                k, off, w = feats[names[0]]
                batch[table_name] = (k, off, None if w is None else w.reshape(-1).to(torch.float32))
                continue
            keys, offs, ws, sizes, base = [], [], [], [], 0
            for name in names:
                k, off, w = feats[name]
                keys.append(k)
                offs.append(off + base)
                ws.append(w)
                sizes.append(off.shape[0])
                base += k.shape[0]
            weights = None
            if any(w is not None for w in ws):
                weights = torch.cat(
                    [
                        torch.ones(k.shape[0]) if w is None else w.reshape(-1).to(torch.float32)
                        for k, w in zip(keys, ws, strict=True)
                    ]
                )
            batch[table_name] = (np.concatenate(keys), np.concatenate(offs), weights)
            splits[table_name] = sizes
        sync = self.fused_optimizer.sync
        if self.collection is not None:
            outs = embed_grouped(
                self._anchor, self.training, self.collection, batch, self.mode, self.max_norm, sync
            )
        else:
            outs = {
                n: embed(
                    self._anchor,
                    self.training,
                    self.tables[by_table[n][0]],
                    k,
                    off,
                    w,
                    self.mode,
                    self.max_norm,
                    sync,
                    like=like,  # on the features' device (the table's device path there)
                )
                for n, (k, off, w) in batch.items()
            }
        for table_name, names in by_table.items():
            out = outs[table_name]
            if len(names) == 1:
                results[names[0]] = out
                continue
            if self.stack and len(by_table) == 1:  # every feature's bags, in feature order
                stacked: torch.Tensor = out.view(len(names), splits[table_name][0], -1)
                return stacked
            for name, part in zip(names, torch.split(out, splits[table_name]), strict=True):
                results[name] = part
        ordered = {name: results[name] for name in feats}
        if self.concat:
            return torch.cat(list(ordered.values()), dim=1)
        if self.stack:
            return torch.stack(list(ordered.values()))
        return ordered

    def get_extra_state(self) -> dict[str, Any]:
        return {
            name: {"table": t.name, "config": t.config.to_dict()} for name, t in self.tables.items()
        }

    def set_extra_state(self, state: dict[str, Any]) -> None:
        for name, t in self.tables.items():
            if state.get(name, {}).get("table") != t.name:
                raise ValueError(f"state_dict has no matching table for feature {name!r}")
