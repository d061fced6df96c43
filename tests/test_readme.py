"""Every python block in the README runs.

Blocks of ``>>>`` examples are doctests, which pytest runs from the README itself
(``--doctest-glob=README.md`` and ``README.md`` in ``testpaths``, checked here). The other blocks
are scripts: they run here in order, each in a new process, all in one temporary directory (a
later block may open what an earlier one wrote), with the environment torchrun gives a job of
one rank, so the ``torch.distributed`` blocks run too. A block that cannot run here is marked
on the line above its fence with ``<!-- readme-test: skip REASON -->``: it is skipped by name,
and ``SKIPPED`` counts the marked blocks so that a new one is a visible change.
"""

from __future__ import annotations

import doctest
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SKIP = re.compile(r"<!-- readme-test: skip (?P<reason>.+?) -->")
SKIPPED = 1  # blocks marked to skip: the TorchRec configs block (torchrec is not a dependency)


@dataclass(frozen=True)
class Block:
    line: int
    code: str
    skip: str | None

    @property
    def is_doctest(self) -> bool:
        return self.code.lstrip().startswith(">>>")

    @property
    def name(self) -> str:
        """The file name its first comment gives (``# sharded.py, ...``), else its line."""
        first = re.match(r"# ([\w.-]+\.py)\b", self.code)
        return f"{first.group(1)} (README.md:{self.line})" if first else f"README.md:{self.line}"


def blocks() -> list[Block]:
    found = []
    lines = README.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            end = lines.index("```", i + 1)
            mark = SKIP.search(lines[i - 1]) if i else None
            found.append(
                Block(i + 1, "\n".join(lines[i + 1 : end]) + "\n", mark and mark["reason"])
            )
            i = end
        i += 1
    return found


SCRIPTS = [b for b in blocks() if not b.is_doctest]
Completed = subprocess.CompletedProcess[str]


def test_the_doctest_blocks_run_under_pytest() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pytest_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    options = pytest_config["ini_options"]
    assert "README.md" in options["testpaths"]
    assert "--doctest-glob=README.md" in options["addopts"].split()
    parser = doctest.DocTestParser()
    for block in blocks():
        if block.is_doctest:  # examples doctest will find, with their expected output
            assert parser.get_examples(block.code), block.name


def test_the_skipped_blocks_are_counted() -> None:
    marked = [b.name for b in blocks() if b.skip is not None]
    assert len(marked) == SKIPPED, marked


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Completed]:
    """Every script block that is not skipped, run in order in one directory."""
    work = tmp_path_factory.mktemp("readme")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    one_rank = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    one_rank |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    results = {}
    for block in SCRIPTS:
        if block.skip is None:
            results[block.line] = subprocess.run(
                [sys.executable, "-c", block.code],
                cwd=work,
                env={**os.environ, **one_rank, "PYTHONPATH": str(ROOT)},
                capture_output=True,
                text=True,
                timeout=600,
            )
    return results


@pytest.mark.parametrize("block", SCRIPTS, ids=[b.name for b in SCRIPTS])
def test_the_script_block_runs(
    block: Block, ran: dict[int, subprocess.CompletedProcess[str]]
) -> None:
    if block.skip is not None:
        pytest.skip(f"{block.name}: {block.skip}")
    if "torch" in block.code:
        pytest.importorskip("torch")
    done = ran[block.line]
    assert done.returncode == 0, f"{block.name} failed:\n{done.stderr[-3000:]}"
