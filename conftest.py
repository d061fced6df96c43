"""Repository-level pytest settings: doctests of the torch binding need torch installed, and
the doctests' ``tempfile.mkdtemp()`` databases go under pytest's own temporary directories
(which it prunes), not into /tmp for good."""

import importlib.util
import tempfile
from pathlib import Path

import pytest

collect_ignore = [] if importlib.util.find_spec("torch") else ["evdb/torch.py"]


@pytest.fixture(autouse=True)
def _doctest_temp_dirs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if isinstance(request.node, pytest.DoctestItem):
        tmp_path: Path = request.getfixturevalue("tmp_path")
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
