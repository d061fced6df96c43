"""The README's main job (examples/movielens.py) learns, spills, checkpoints and serves."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "movielens.py"


def test_the_example_learns_and_its_serving_export_scores_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location("movielens_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    code = module.main(["--synthetic", "--epochs", "2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "equal the model's: True" in out
    aucs = [float(a) for a in re.findall(r"held-out AUC ([0-9.]+)", out)]
    assert len(aucs) == 2 and aucs[-1] > 0.6  # clearly better than chance on held-out data
    disk = [int(d.replace(",", "")) for d in re.findall(r"disk ([0-9,]+),", out)]
    assert disk[-1] > 0  # rows spilled to RocksDB
    assert (tmp_path / "checkpoint" / "MANIFEST.json").exists()
    if importlib.util.find_spec("fastapi") is not None:  # the serve extra: it served over REST
        assert "equal to the snapshot read directly: True" in out
        assert "curl -s -X POST localhost:8000/v1/tables/item/lookup" in out
