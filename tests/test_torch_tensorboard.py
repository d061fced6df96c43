"""examples/movielens.py --tensorboard: the loss, the AUC and each table's figures under
/metrics' names go to a SummaryWriter; tensorboard stays optional (a clear usage error)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "movielens.py"
ARGS = ["--synthetic", "--epochs", "1", "--no-serve", "--publish-every", "0"]


def example() -> Any:
    spec = importlib.util.spec_from_file_location("movielens_tensorboard", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Writer:
    """torch.utils.tensorboard.SummaryWriter's part the example uses, recording."""

    made: ClassVar[list[Writer]] = []

    def __init__(self, logdir: str) -> None:
        self.logdir, self.scalars, self.closed = logdir, [], False
        Writer.made.append(self)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def close(self) -> None:
        self.closed = True


def test_the_example_logs_every_tables_figures_to_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stub = types.ModuleType("torch.utils.tensorboard")
    stub.SummaryWriter = Writer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", stub)
    module = example()
    logdir = tmp_path / "tb"
    assert module.main([*ARGS, "--out", str(tmp_path / "out"), "--tensorboard", str(logdir)]) == 0
    (writer,) = Writer.made
    assert writer.logdir == str(logdir) and writer.closed
    tags = {tag for tag, _, _ in writer.scalars}
    for table in ("user", "item", "user_bias", "item_bias"):
        assert f"evdb_table_rows/{table}" in tags
        assert f"evdb_tier_rows/{table}/dram" in tags and f"evdb_tier_rows/{table}/rocksdb" in tags
        assert f"evdb_not_admitted/{table}" in tags and f"evdb_expired_on_pull/{table}" in tags
        assert f"evdb_evictions/{table}/dram" in tags
        assert f"evdb_read_share/{table}/pull/dram" in tags
    steps = sorted({s for tag, _, s in writer.scalars if tag == "evdb_table_rows/item"})
    assert steps and all(s % module.LOG_EVERY == 0 for s in steps) and len(steps) > 2
    assert {"train/loss", "eval/auc"} <= tags
    rows = [v for tag, v, _ in writer.scalars if tag == "evdb_table_rows/item"]
    assert rows == sorted(rows) and rows[-1] > 0  # rows are created as training meets ids
    assert f"tensorboard --logdir {logdir}" in capsys.readouterr().out


def test_without_tensorboard_the_flag_is_a_usage_error_that_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import raises
    module = example()
    with pytest.raises(SystemExit) as exited:
        module.main([*ARGS, "--out", str(tmp_path), "--tensorboard", str(tmp_path / "tb")])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--tensorboard needs the tensorboard package" in err and "pip install tensorboard" in err
    assert not (tmp_path / "db").exists()  # refused before anything was made
