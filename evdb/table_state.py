"""The persistence of a ``Table``'s state that is not rows: its version and counters, its
incarnation's uid, its pending admission counts and the step counts of the rows below.

``evdb.database`` saves what ``flush`` returns in its metadata and hands it back to ``load``;
the rows themselves persist in the backing tier. ``Table._flush``, ``_load_state`` and
``_checkpoint_info`` call these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from evdb.table import Table

__all__ = ["COUNTERS", "checkpoint_info", "flush", "load"]

# The order of the saved counters after the first four; a counter added later goes last, so
# that an older save still loads (its missing counters start at 0).
COUNTERS = (
    "not_admitted",
    "expired_on_pull",
    "dropped_gradients",
    "frozen_gradients",
    "pulls_not_pushed",
)


def flush(table: Table) -> dict[str, np.ndarray]:
    """``Table._flush`` (see there)."""
    table._chain.flush()
    table._chain.below_steps.live(table._min_live())  # merges the expired steps' counts
    state: dict[str, np.ndarray] = {
        "counters": np.array(
            [
                table._version,
                table._pushes,
                table._dram.evictions,
                table._dram.expired_evictions,
            ]
            + [table._counters[c] for c in COUNTERS],
            dtype=np.int64,
        ),
    }
    state["uid"] = np.frombuffer(bytes.fromhex(table._uid), dtype=np.uint8)
    for name, arr in table._admission.to_arrays().items():
        state[f"admission.{name}"] = arr
    state.update(table._chain.to_arrays())  # below_steps.*, backing.*
    return state


def checkpoint_info(table: Table) -> dict[str, Any]:
    """``Table._checkpoint_info`` (see there)."""
    return {"uid": table._uid, "version": table._version, "rows": len(table)}


def load(table: Table, state: dict[str, np.ndarray]) -> None:
    """``Table._load_state`` (see there)."""
    if "uid" in state:
        table._uid = state["uid"].tobytes().hex()
    c = state["counters"].tolist()
    table._version, table._pushes, table._dram.evictions, table._dram.expired_evictions = c[:4]
    saved = c[4:] + [0] * (len(COUNTERS) - len(c[4:]))  # counters added later
    table._counters.update(zip(COUNTERS, saved, strict=True))
    table._admission.load_arrays(_prefixed(state, "admission."))
    table._chain.load_arrays(state)  # without a disk tier, every row is loaded into DRAM


def _prefixed(state: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
