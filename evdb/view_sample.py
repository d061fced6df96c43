"""Row samples of readable tables for the dashboard's figures, a view's built from its
table's sample and its overlay (``evdb.sampling`` samples one table; ``evdb.view`` has views)."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from evdb.kernels.hashing import mix64_np
from evdb.sampling import RowSample, sample_steps
from evdb.ttl import min_live_step
from evdb.view import ReadableTable, TableView

if TYPE_CHECKING:
    from evdb.table import Table

__all__ = ["SampleCache"]


class SampleCache:
    """Row samples (``evdb.sampling``) of readable tables, at most ``max_rows`` rows each.

    A view's sample is its table's, taken once per table and kept (the one of each table
    name last used), with the overlay merged in: the rows expired at the view's step leave,
    the rows the overlay replaces or removes leave, its live rows join (a delta carries no
    pull counts: their ``freq`` is 0), and the ``max_rows`` of lowest priority are kept. So
    a server following a publish root scans a full once, not once per publication. ``scans``
    counts the scans of whole tables taken. A sample is kept while its table object lives (a
    weak reference) and is the one served for that name: for tables nobody writes.
    """

    def __init__(self, max_rows: int = 10_000) -> None:
        self.max_rows = max_rows
        self.scans = 0
        self._held: dict[str, tuple[weakref.ref[Any], RowSample]] = {}

    def sample(self, table: ReadableTable) -> RowSample:
        """The sample of ``table`` (scanning it if nothing kept serves)."""
        for out in self.steps(table):
            if out is not None:
                return out
        raise AssertionError("steps ends with the sample")  # pragma: no cover

    def steps(self, table: ReadableTable) -> Iterator[RowSample | None]:
        """:meth:`sample` a chunk at a time: None after each chunk scanned (a server gives
        other work a turn there), then the sample."""
        view = table if isinstance(table, TableView) else None
        under = view.table if view is not None else table
        if view is not None and view.step < under.step:  # the kept sample misses rows
            yield from sample_steps(cast("Table", table), self.max_rows)
            return
        held = self._held.get(under.name)
        if held is None or held[0]() is not under:
            sample = None
            for sample in sample_steps(cast("Table", under), self.max_rows):
                if sample is None:
                    yield None
            assert sample is not None
            self.scans += 1
            held = self._held[under.name] = (weakref.ref(under), sample)
        yield held[1] if view is None else _merged_sample(held[1], view, self.max_rows)


def _merged_sample(sample: RowSample, view: TableView, max_rows: int) -> RowSample:
    """A sample of ``view``'s table brought to the view (see :class:`SampleCache`)."""
    step = view.step
    min_live = min_live_step(step, view.config.ttl_steps)
    keep = sample.last_step >= min_live
    over = view.overlay.rows
    if over.n_rows:
        keep &= ~over.holds(sample.keys)
    live = over.live(min_live)
    m = int(np.count_nonzero(live))
    keys = np.concatenate([sample.keys[keep], over.keys[live]])
    values = np.concatenate([sample.values[keep], over.values[live]])
    freq = np.concatenate([sample.freq[keep], np.zeros(m, np.int64)])
    last = np.concatenate([sample.last_step[keep], over.last_step[live]])
    if m:
        order = np.argsort(
            mix64_np(keys.view(np.uint64)), kind="stable"
        )  # as sampling's[:max_rows]
        keys, values, freq, last = keys[order], values[order], freq[order], last[order]
    return RowSample(keys, values, freq, last, step, view.count())
