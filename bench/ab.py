"""A/B a benchmark between two checkouts of evdb, alternating runs in one session.

    python bench/ab.py --old /tmp/evdb-old --pairs 3 -- bench/bench_lookup.py --rows 1000000

runs the benchmark script (given relative to the repository) from the old checkout and from
this one, old then new, ``--pairs`` times, each with ``PYTHONPATH`` set to its checkout so that
``import evdb`` finds that tree's code. Every line a run prints is read as a template (its text
with each number replaced by ``#``) and its numbers; lines with the same template are paired
across runs, and each number is reported as the median of the old runs, the median of the new
ones and new / old. Alternating pairs spreads the machine's drift (other work, thermal state)
over both sides instead of charging it to whichever ran second.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

NUMBER = re.compile(r"-?\d[\d,]*\.?\d*(?:e[-+]?\d+)?")
HERE = Path(__file__).resolve().parents[1]


def run(tree: Path, script: str, args: list[str]) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, str(tree / script), *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.splitlines()


def parse(lines: list[str]) -> dict[str, list[float]]:
    """template -> numbers, for the lines that hold numbers (the first of a repeated template)."""
    found: dict[str, list[float]] = {}
    for line in lines:
        numbers = [float(m.replace(",", "")) for m in NUMBER.findall(line)]
        template = NUMBER.sub("#", line).strip()
        if numbers and template not in found:
            found[template] = numbers
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", type=Path, required=True, help="the other checkout (A)")
    p.add_argument("--new", type=Path, default=HERE, help="this checkout by default (B)")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("script", help="the benchmark, relative to the repository")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    runs: dict[str, list[dict[str, list[float]]]] = defaultdict(list)
    for i in range(a.pairs):
        for side, tree in (("old", a.old), ("new", a.new)):
            print(f"pair {i + 1}/{a.pairs}: {side} ({tree})", file=sys.stderr, flush=True)
            runs[side].append(parse(run(tree, a.script, a.args)))
    print(f"{a.script} {' '.join(a.args)}: median of {a.pairs} alternating pairs")
    print(f"  old = {a.old}, new = {a.new}")
    for template in runs["new"][0]:
        olds = [r[template] for r in runs["old"] if template in r]
        news = [r[template] for r in runs["new"] if template in r]
        if not olds or any(len(x) != len(news[0]) for x in olds + news):
            continue
        cells = []
        for j in range(len(news[0])):
            old = statistics.median(x[j] for x in olds)
            new = statistics.median(x[j] for x in news)
            ratio = f"{new / old:.3f}" if old else "-"
            cells.append(f"{old:g} -> {new:g} ({ratio})")
        print(f"  {template}\n      " + "; ".join(cells))


if __name__ == "__main__":
    main()
