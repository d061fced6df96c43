"""bench/bench_lowp_quality.py on a tiny setting: every variant trains (or is served) and gets
its row in the table; no AUC value is asserted (the bench reports them)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # as `python bench/...` does: for _common
    spec = importlib.util.spec_from_file_location(
        "bench_lowp_quality", BENCH / "bench_lowp_quality.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_every_variant_gets_a_row_and_each_run_stops_at_steps(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench(monkeypatch)
    assert bench.main(["--dataset", "zipf", "--seeds", "1", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    trained = [v for v, _, _ in bench.TRAINED]
    served = [v for v, _ in bench.SERVED]
    assert trained[0] == "float32" and {"int8 serving", "int4 serving"} <= set(served)
    assert {"bfloat16 stochastic", "float16 stochastic", "bfloat16 nearest"} <= set(trained)
    for variant in trained:  # each trained run took exactly --steps steps
        assert re.search(rf"seed 0, {variant}: AUC 0\.\d{{4}} \(.* s, step 3\)", out), variant
    number = r"[01]\.\d{4}"
    lines = out[out.index("held-out AUC over 1 seeds") :].splitlines()
    for variant in trained + served:
        row = [line for line in lines if line.startswith(variant + "  ")]
        assert len(row) == 1, variant
        assert re.match(rf"{re.escape(variant)}\s+{number}\s+{number}", row[0]), row[0]
        if variant != "float32":
            assert re.search(r"[+-]\d\.\d{5}\s+[+-]\d\.\d{5} \.\. [+-]\d\.\d{5}", row[0]), row


def test_bad_arguments_are_usage_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench(monkeypatch)
    for argv, named in (
        (["--seeds", "0"], "--seeds"),
        (["--lr", "0"], "--lr must be > 0, got 0.0"),
        (["--variants", "float32,int2 serving"], "unknown variant 'int2 serving'"),
    ):
        with pytest.raises(SystemExit) as exit_:
            bench.main(argv)
        assert exit_.value.code == 2 and named in capsys.readouterr().err
