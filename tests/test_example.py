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


def test_the_example_under_torchrun_reaches_the_single_process_auc(tmp_path: Path) -> None:
    """torchrun --standalone --nproc_per_node 2 (the README's command): sharded tables, DDP
    for the dense part, the same held-out AUC as one process (within 0.01), and the shards
    exported merged score the held-out set as the model does."""
    import os
    import subprocess

    def run(*launcher: str, out: Path) -> list[float]:
        done = subprocess.run(
            [*launcher, str(EXAMPLE), "--synthetic", "--epochs", "2", "--no-serve", "--out", out],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "equal the model's: True" in done.stdout
        if importlib.util.find_spec("fastapi") is not None:  # it published; a follower agrees
            assert "serves the trained rows exactly: True" in done.stdout
        return [float(a) for a in re.findall(r"held-out AUC ([0-9.]+)", done.stdout)]

    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    two = run(*torchrun, "--nproc_per_node", "2", out=tmp_path / "two")
    one = run(sys.executable, out=tmp_path / "one")
    assert len(one) == len(two) == 2
    assert abs(one[-1] - two[-1]) < 0.01, (one, two)
    assert (tmp_path / "two" / "checkpoint" / "sharding.json").is_file()
