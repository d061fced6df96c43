"""The README's `make run` job: the demo trains, admits, expires and reopens."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import evdb
from evdb import demo


def test_demo_runs_and_leaves_a_database_that_reopens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.main([str(tmp_path), "--steps", "60", "--batch", "2048"]) == 0
    out = capsys.readouterr().out
    assert "compact() removed" in out and "lookup(1)" in out
    first, last = (
        float(x) for x in re.findall(r"loss .*?: ([0-9.]+) at step 0 -> ([0-9.]+)", out)[0]
    )
    assert last < first / 4  # it learned
    with evdb.open(tmp_path) as db:
        t = db.table("item")
        assert db.step == 60 and len(t) > 0
        assert t.stats()["admission"]["not_admitted"] > 0  # admission filtered the long tail
        assert float(t.lookup([1]).mean()) > 0.3  # the hottest key moved toward the target
