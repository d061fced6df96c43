"""Sharded tables over the ranks of a ``torch.distributed`` job.

Each rank holds one ordinary evdb database, its shard; a key's owner is fixed by its table's
placement. A sharded table keeps ``Table``'s contract with collectives where it must: keys and
occurrence counts go to their owners, rows come back, gradients go to the owners, which apply
the optimizer once, so N ranks equal one process on the same global batch.

::

    import torch.distributed as dist, evdb
    from evdb import distributed as evd

    dist.init_process_group("gloo")          # torchrun sets rank and world size
    db = evd.open(root)                      # collective
    t = db.create_table("item", dim=16, optimizer=evdb.optim.Adagrad(lr=0.1))
    p = t.pull(keys)                         # this rank's batch
    t.push(p, p.combine_backward(grad_out, offsets, combiner="sum"))
    db.advance(); db.checkpoint(dest); db.close()

Many tables exchange together, 5 collectives a step whatever their number
(``ShardedCollection``; ``evdb.torch.EmbeddingBagCollection`` does it for its tables)::

    coll = evd.ShardedCollection([user, item], payload_dtype="bfloat16")
    p = coll.pull({"user": user_ids, "item": item_ids})
    coll.push(p, {"user": grad_user, "item": grad_item})

``TrainPipeline(coll).run(batches, keys_of)`` sends batch i+1's keys (and starts the owners'
disk reads) while batch i computes, with the plain loop's results.

The offline parts (``reshard``, the merged ``export``, ``info``, ``Placement``) need no
process group, and no torch.
"""

from __future__ import annotations

from typing import Any

from evdb.distributed.checkpoint import export, info, reshard
from evdb.distributed.placement import PLACEMENTS, Placement

__all__ = [
    "PLACEMENTS",
    "CollectionPulled",
    "Placement",
    "ShardedCollection",
    "ShardedDatabase",
    "ShardedPulled",
    "ShardedTable",
    "TrainPipeline",
    "export",
    "info",
    "open",
    "reshard",
]

_WITH_TORCH = {
    "open": "evdb.distributed.database",
    "ShardedDatabase": "evdb.distributed.database",
    "ShardedTable": "evdb.distributed.table",
    "ShardedPulled": "evdb.distributed.table",
    "ShardedCollection": "evdb.distributed.group",
    "CollectionPulled": "evdb.distributed.group",
    "TrainPipeline": "evdb.distributed.pipeline",
}


def __getattr__(name: str) -> Any:
    """The names that need torch.distributed, imported on first use."""
    if name in _WITH_TORCH:
        import importlib

        return getattr(importlib.import_module(_WITH_TORCH[name]), name)
    raise AttributeError(f"module 'evdb.distributed' has no attribute {name!r}")
