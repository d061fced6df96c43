"""A database for the dashboard's tests, and helpers to serve it on a loopback port.

Tables: ``zipf`` (int64, pulled with Zipf(1.2) key frequencies: key of rank r pulled
round(C r^-1.2) times), ``ages`` (TTL 100 steps, half the rows written at step 0 and half at
step 100: ages 100 and 0), ``words`` (str keys kept, GloVe vectors when ../shared/data has
them, else random ones).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import evdb

from . import serve_process

ZIPF_RANKS = 3000
ZIPF_TOP = 20_000  # pulls of the rank-1 key
ZIPF_SLOPE = -1.2
AGES_TTL = 100

_SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
GLOVE = _SHARED / "glove" / "glove.6B.50d.top10k.txt"


def zipf_key(rank: np.ndarray) -> np.ndarray:
    return rank * 11 + 5


def words() -> tuple[list[str], np.ndarray]:
    """The first 2,000 GloVe words and vectors, or random ones where the file is absent."""
    if GLOVE.exists():
        tokens, rows = [], []
        with GLOVE.open(encoding="utf-8") as f:
            for _, line in zip(range(2000), f, strict=False):
                word, *rest = line.rstrip("\n").split(" ")
                tokens.append(word)
                rows.append(np.array(rest, dtype=np.float32))
        return tokens, np.stack(rows)
    rng = np.random.default_rng(5)
    return [f"w{i}" for i in range(2000)], rng.normal(size=(2000, 50)).astype(np.float32)


def build_database(path: Path) -> Path:
    rng = np.random.default_rng(11)
    with evdb.open(path) as db:
        z = db.create_table("zipf", dim=8, initializer=evdb.init.Normal(std=0.1, seed=2))
        ranks = np.arange(1, ZIPF_RANKS + 1)
        counts = np.maximum(1, np.round(ZIPF_TOP * ranks**ZIPF_SLOPE)).astype(np.int64)
        pulls = np.repeat(zipf_key(ranks), counts)
        rng.shuffle(pulls)
        for batch in np.array_split(pulls, 4):
            z.pull(batch)
        a = db.create_table("ages", dim=4, ttl_steps=AGES_TTL)
        a.upsert(np.arange(500), rng.normal(size=(500, 4)).astype(np.float32))
        db.advance(AGES_TTL)
        a.upsert(np.arange(500, 1000), rng.normal(size=(500, 4)).astype(np.float32))
        tokens, vectors = words()
        w = db.create_table("words", dim=vectors.shape[1], key_type="str", keep_strings=True)
        w.upsert(tokens, vectors)
    return path


@contextmanager
def serving(path: Path, *args: str, interval_s: float = 1.0) -> Iterator[str]:
    """``evdb serve path`` on a free loopback port; yields its URL, stops it after."""
    proc, url, _ = serve_process.start(
        str(path), *args, env={"EVDB_SAMPLE_INTERVAL_S": str(interval_s)}
    )
    try:
        yield url
    finally:
        serve_process.stop(proc)
