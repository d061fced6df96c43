"""A Hypothesis state machine: random pull/push/upsert/delete/compact/lookup/advance/reopen
sequences on a Table, checked after every step against a plain-dict model of the contract.

The model knows nothing of tiers, kernels or layouts: a dict of rows, a dict of pending
admission counts, the step, and the batch in flight. With a bounded DRAM tier and no disk the
model cannot predict *which* rows the score policy evicts, so it accepts evictions of rows
outside the batch in flight and checks the eviction counter instead. With a disk tier under a
two-row DRAM tier (almost every step spills and promotes) nothing may vanish, and the model
is exact; a simulated crash (the process stops without a flush) must bring back exactly the
state of the last flush. The HBM variants put an emulated HBM tier of two rows on top (over a
three-row DRAM tier over RocksDB, or over an unbounded DRAM tier without a disk), so rows move
through every level, and the same model must hold.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import evdb

POOL = [0, -1, 1, 2, 3, 17, 42, 99, 2**63 - 1, -(2**63)]
DIM, TTL, MIN_COUNT, LR, L2 = 3, 3, 2, 0.5, 0.015
INIT = evdb.init.Normal(0.0, 0.01, seed=3)
keys_st = st.lists(st.sampled_from(POOL), min_size=0, max_size=8)
floats = st.floats(-2.0, 2.0, allow_nan=False, width=32)


def init_row(key: int) -> np.ndarray:
    return INIT.values(np.array([key], np.int64), DIM)[0]


class TableMachine(RuleBasedStateMachine):
    top = "dram"  # the top tier's name in stats()["tiers"]
    capacity: int | None = None
    disk = True

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="evdb-state-"))
        self.db = evdb.open(self.dir)
        self.t = self._create()
        self.db.flush()  # the table exists from here on, even after a crash
        self.step = 0
        self.rows: dict[int, dict] = {}  # key -> {"value", "last_step", "freq"}
        self.pending: dict[int, tuple[int, int]] = {}  # key -> (count, last_seen)
        self.in_flight: set[int] = set()
        self.pulled: evdb.Pulled | None = None
        self.evicted = 0
        self.flushed = self._model()  # the state a crash goes back to

    def _model(self) -> tuple:
        return copy.deepcopy((self.rows, self.pending, self.step, self.evicted))

    def _create(self) -> evdb.Table:
        return self.db.create_table(
            "t",
            dim=DIM,
            initializer=INIT,
            ttl_steps=TTL,
            l2_threshold=L2,
            admission=evdb.admission.Counter(min_count=MIN_COUNT),
            optimizer=evdb.optim.SGD(lr=LR),
            **self.tiers(),
        )

    def tiers(self) -> dict:
        """The tier options of the table (the model needs only capacity and disk)."""
        return {"dram_rows": self.capacity, "disk": self.disk}

    def teardown(self) -> None:
        self.db.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- model helpers --------------------------------------------------------------------
    def live(self, key: int) -> bool:
        return key in self.rows and self.step - self.rows[key]["last_step"] <= TTL

    def expected(self, key: int) -> np.ndarray:
        return self.rows[key]["value"] if self.live(key) else init_row(key)

    def sync_evictions(self, written: set[int]) -> None:
        """Accept the policy's evictions: never of the batch in flight or of rows just written
        (and, with a disk tier, never at all: the invariants then find any lost row)."""
        if self.disk:
            return
        keys = sorted(self.rows)
        present = self.t.resident(np.array(keys, np.int64))  # stored, live or not
        for key, there in zip(keys, present, strict=True):
            if not there and self.live(key):
                assert self.capacity is not None, f"row {key} vanished without a capacity"
                assert key not in self.in_flight, f"row {key} of the batch in flight evicted"
                assert key not in written, f"row {key} evicted by its own write"
                del self.rows[key]
                self.evicted += 1
            elif not there:
                del self.rows[key]  # an expired row the tier reclaimed early

    # -- rules ----------------------------------------------------------------------------
    @rule(keys=keys_st)
    def pull(self, keys: list[int]) -> None:
        uniq = list(dict.fromkeys(keys))
        if self.capacity is not None and not self.disk and len(uniq) > self.capacity:
            with pytest.raises(evdb.CapacityError):
                self.t.pull(np.array(keys, np.int64))
            return
        p = self.t.pull(np.array(keys, np.int64))
        assert p.keys.tolist() == uniq
        self.in_flight = set()
        for i, key in enumerate(uniq):
            count = keys.count(key)
            if key in self.rows and not self.live(key):
                del self.rows[key]  # expired: afresh
            if key in self.rows:
                self.rows[key]["freq"] += count
                self.rows[key]["last_step"] = self.step
            else:
                total = self.pending.get(key, (0, 0))[0] + count
                if total >= MIN_COUNT:
                    self.pending.pop(key, None)
                    self.rows[key] = {"value": init_row(key), "last_step": self.step, "freq": total}
                else:
                    self.pending[key] = (total, self.step)
            assert p.admitted[i] == (key in self.rows), key
            np.testing.assert_array_equal(p.rows[i], self.expected(key))
            if key in self.rows:
                self.in_flight.add(key)
        self.pulled = p
        self.sync_evictions(set())

    @precondition(lambda self: self.pulled is not None)
    @rule(data=st.data(), per_position=st.booleans())
    def push(self, data: st.DataObject, per_position: bool) -> None:
        p = self.pulled
        n = p.inverse.shape[0] if per_position else p.keys.shape[0]
        grads = np.array(
            data.draw(st.lists(floats, min_size=n * DIM, max_size=n * DIM)), dtype=np.float32
        ).reshape(n, DIM)
        self.t.push(p, grads, per_position=per_position)
        # The fused update sums each key's gradients in float64, in position order, applies
        # the rule in float64 and stores float32.
        summed = np.zeros((p.keys.shape[0], DIM), np.float64)
        np.add.at(summed, p.inverse if per_position else np.arange(n), grads.astype(np.float64))
        for i, key in enumerate(p.keys.tolist()):
            if p.admitted[i] and self.live(key):
                row = self.rows[key]
                row["value"] = (row["value"].astype(np.float64) - LR * summed[i]).astype(np.float32)
                row["last_step"] = self.step
        self.pulled = None
        self.in_flight = set()
        self.sync_evictions(set())

    @rule(keys=keys_st, data=st.data())
    def upsert(self, keys: list[int], data: st.DataObject) -> None:
        values = np.array(
            data.draw(st.lists(floats, min_size=len(keys) * DIM, max_size=len(keys) * DIM)),
            dtype=np.float32,
        ).reshape(len(keys), DIM)
        uniq = set(keys)
        if self.capacity is not None and not self.disk:
            pinned = {k for k in self.in_flight if self.live(k)}
            if len(pinned | uniq) > self.capacity:
                with pytest.raises(evdb.CapacityError):
                    self.t.upsert(np.array(keys, np.int64), values)
                return
        self.t.upsert(np.array(keys, np.int64), values)
        for key, value in zip(keys, values, strict=True):
            if self.live(key):
                self.rows[key]["value"] = value
                self.rows[key]["last_step"] = self.step
            else:  # new or expired: a new row, which is not part of the batch in flight
                self.rows[key] = {"value": value, "last_step": self.step, "freq": 0}
                self.in_flight.discard(key)
            self.pending.pop(key, None)
        self.sync_evictions(uniq)

    @rule(keys=keys_st)
    def delete(self, keys: list[int]) -> None:
        uniq = set(keys)
        want = sum(self.live(k) for k in uniq)
        assert self.t.delete(np.array(keys, np.int64)) == want
        for key in uniq:
            self.rows.pop(key, None)
            self.pending.pop(key, None)
        self.in_flight -= uniq  # a deleted row leaves the batch; a re-created one is new

    @rule()
    def compact(self) -> None:
        expired = [k for k in self.rows if not self.live(k)]
        for k in expired:
            del self.rows[k]
        weak = [k for k, r in self.rows.items() if np.linalg.norm(r["value"]) < np.float32(L2)]
        for k in weak:
            del self.rows[k]
        stale = [k for k, (_, seen) in self.pending.items() if self.step - seen > TTL]
        for k in stale:
            del self.pending[k]
        got = self.t.compact()
        assert got["l2"] == len(weak)
        assert got["admission_forgotten"] == len(stale)
        # rows evicted while expired were reclaimed by the tier already, not by compact
        assert got["expired"] <= len(expired)

    @rule(n=st.integers(0, 3))
    def advance(self, n: int) -> None:
        self.step = self.db.advance(n)

    @rule()
    def reopen(self) -> None:
        self.db.close()
        self.db = evdb.open(self.dir)
        self.t = self.db.table("t")
        assert self.db.step == self.step
        self.in_flight = set()  # the batch in flight ends with the process
        self.pulled = None
        self.flushed = self._model()

    @rule()
    def flush(self) -> None:
        self.db.flush()
        self.flushed = self._model()

    @rule()
    def crash(self) -> None:
        """The process stops with no flush: reopening gives the last flush, exactly."""
        self.db.close(flush=False)
        self.db = evdb.open(self.dir)
        self.t = self.db.table("t")
        self.rows, self.pending, self.step, self.evicted = copy.deepcopy(self.flushed)
        assert self.db.step == self.step
        self.in_flight = set()
        self.pulled = None

    # -- invariants -----------------------------------------------------------------------
    @invariant()
    def reads_match_the_model(self) -> None:
        pool = np.array(POOL, np.int64)
        want = np.stack([self.expected(k) for k in POOL])
        np.testing.assert_array_equal(self.t.lookup(pool), want)
        assert self.t.contains(pool).tolist() == [self.live(k) for k in POOL]
        assert len(self.t) == sum(self.live(k) for k in self.rows)
        items = {
            k: v
            for keys, vals in self.t.items(chunk_rows=3)
            for k, v in zip(keys.tolist(), vals, strict=True)
        }
        assert sorted(items) == sorted(k for k in self.rows if self.live(k))
        found, records = self.t.read_records(pool)
        assert found.tolist() == [self.live(k) for k in POOL]
        live = [k for k in POOL if self.live(k)]
        assert records.last_step.tolist() == [self.rows[k]["last_step"] for k in live]
        assert records.freq.tolist() == [self.rows[k]["freq"] for k in live]
        if self.capacity is not None and self.disk:  # over capacity only by the batch
            assert self.t.stats()["tiers"][self.top]["rows"] <= max(
                self.capacity, len(self.in_flight)
            )
        elif self.capacity is not None:
            assert self.t.stats()["tiers"][self.top]["rows"] <= self.capacity
            assert self.t.stats()["tiers"]["dram"]["evictions"] >= self.evicted


class UnboundedTable(TableMachine):
    capacity = None


class BoundedTable(TableMachine):
    capacity = 6
    disk = False


class TieredTable(TableMachine):
    capacity = 2


class HbmTable(TableMachine):
    """HBM (2 rows, emulated) over DRAM (3 rows) over RocksDB; ``capacity`` is the top tier's."""

    capacity = 2
    dram_rows = 3

    top = "hbm"

    def tiers(self) -> dict:
        return {"hbm_rows": self.capacity, "device": "cpu", "dram_rows": self.dram_rows}

    @invariant()
    def every_level_within_its_rows(self) -> None:
        tiers = self.t.stats()["tiers"]
        if self.dram_rows is not None:
            assert tiers["dram"]["rows"] <= self.dram_rows  # DRAM pins nothing
        assert list(tiers) == ["hbm", "dram", "rocksdb"]


class HbmOverDramTable(HbmTable):
    """HBM (2 rows, emulated) over an unbounded DRAM tier without a disk tier: DRAM is the
    bottom (rows persist at flush); nothing may vanish, so the model stays exact."""

    dram_rows = None

    def tiers(self) -> dict:
        return {**super().tiers(), "disk": False}


TestUnboundedTable = UnboundedTable.TestCase
TestBoundedTable = BoundedTable.TestCase
TestTieredTable = TieredTable.TestCase
TestHbmTable = HbmTable.TestCase
TestHbmOverDramTable = HbmOverDramTable.TestCase
