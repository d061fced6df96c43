"""import_vectors: real word-vector files into tables, frozen rows, and no half-written import."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import evdb

_SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
DATA = _SHARED if _SHARED.is_dir() else Path(__file__).resolve().parents[1] / "data" / "shared"
GENSIM = DATA / "gensim-test-data"


def first_rows(path: Path, n: int, header: bool) -> list[tuple[str, list[float]]]:
    """An independent, deliberately plain parser of text vector files."""
    out = []
    with path.open(encoding="utf-8") as f:
        if header:
            f.readline()
        for line in f:
            fields = line.rstrip().split(" ")
            out.append((fields[0], [float(x) for x in fields[1:]]))
            if len(out) == n:
                break
    return out


@pytest.mark.parametrize(
    "path,format,header",
    [
        (DATA / "glove" / "glove.6B.50d.top10k.txt", "glove", False),  # ../shared/data only
        (GENSIM / "test_glove.txt", "glove", False),
        (GENSIM / "lee_fasttext.vec", "fasttext", True),
        (GENSIM / "EN.1-10.cbow1_wind5_hs0_neg10_size300_smpl1e-05.txt", "word2vec", True),
    ],
)
def test_text_files_import_to_the_values_a_plain_parser_reads(db, path, format, header) -> None:
    if not path.exists():
        pytest.skip(f"{path} is not on this machine")
    got = evdb.import_vectors(db, "w", path, format)
    t = db.table("w")
    want = first_rows(path, 5, header)
    tokens = [w for w, _ in want]
    np.testing.assert_array_equal(t.lookup(tokens), np.array([v for _, v in want], np.float32))
    assert t.strings(tokens) == tokens
    assert got["created"] and got["rows"] == len(t) == got["rows_read"] - got["duplicates"]


def test_binary_word2vec_without_newlines_imports(db) -> None:
    got = evdb.import_vectors(db, "w", GENSIM / "euclidean_vectors.bin", "word2vec-binary")
    assert got["rows"] == 2747 and got["dim"] == 10


def test_a_malformed_line_raises_with_its_number_and_writes_nothing(db, tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("3 2\na 1 2\nb 3 4\nc 5\n")
    with pytest.raises(evdb.CorruptDataError, match="line 4"):
        evdb.import_vectors(db, "w", bad, "word2vec")
    assert db.tables() == []  # no half-created table
    good = tmp_path / "good.txt"
    good.write_text("1 2\nz 9 9\n")
    evdb.import_vectors(db, "w", good, "word2vec")
    with pytest.raises(evdb.CorruptDataError, match="line 4"):
        evdb.import_vectors(db, "w", bad, "word2vec")
    assert len(db.table("w")) == 1 and db.table("w").contains(["a"]).tolist() == [False]


def test_a_lying_header_and_duplicate_words(db, tmp_path: Path) -> None:
    f = tmp_path / "lies.txt"
    f.write_text("1000000000000 2\nx 1 1\ny 2 2\nx 3 3\n")
    got = evdb.import_vectors(db, "w", f, "word2vec")
    assert got["rows_read"] == 3 and got["rows"] == 2 and got["duplicates"] == 1
    assert db.table("w").lookup(["x"]).tolist() == [[3.0, 3.0]]  # the last one wins


def test_frozen_rows_are_read_by_training_and_never_changed(tmp_path: Path) -> None:
    f = tmp_path / "v.txt"
    f.write_text("3 2\nfrozen1 0.5 0.25\nfrozen2 -1 2\nfrozen3 4 4\n")
    with evdb.open(tmp_path / "db") as db:
        evdb.import_vectors(
            db, "w", f, "word2vec", freeze=True, dram_rows=2, optimizer=evdb.optim.SGD(lr=0.5)
        )
        t = db.table("w")
        for _ in range(3):
            p = t.pull(["frozen1", "fresh", "frozen3"])
            np.testing.assert_array_equal(p.rows[0], [0.5, 0.25])  # the exact start row
            t.push(p, np.ones((3, 2)))
        assert t.lookup(["frozen1", "frozen3"]).tolist() == [[0.5, 0.25], [4.0, 4.0]]
        fresh = t.lookup(["fresh"])[0]
        start = t.config.initializer.values(evdb.hash_strings(["fresh"]), 2)[0]
        np.testing.assert_allclose(fresh, start - 1.5, rtol=1e-6)  # new rows train
        assert t.stats()["frozen_gradients"] == 6
    with evdb.open(tmp_path / "db") as db:  # the flag is part of the row: it survives
        t = db.table("w")
        t.push(t.pull(["frozen2"]), np.ones((1, 2)))
        assert t.lookup(["frozen2"]).tolist() == [[-1.0, 2.0]]
        t.upsert(["frozen2"], [[0.0, 0.0]], freeze=False)  # unfreeze
        t.push(t.pull(["frozen2"]), np.ones((1, 2)))
        assert t.lookup(["frozen2"]).tolist() == [[-0.5, -0.5]]


def test_npz_with_integer_keys_and_bad_arguments(db, tmp_path: Path) -> None:
    f = tmp_path / "v.npz"
    np.savez(f, keys=np.array([5, -7]), values=np.array([[1, 2], [3, 4]], np.float32))
    got = evdb.import_vectors(db, "n", f, "npz")
    assert got["rows"] == 2 and db.table("n").lookup([-7]).tolist() == [[3.0, 4.0]]
    with pytest.raises(evdb.ConfigError, match="has dim 2"):
        evdb.import_vectors(db, "n", GENSIM / "euclidean_vectors.bin", "word2vec-binary")
    with pytest.raises(evdb.InvalidArgumentError, match="format must be one of"):
        evdb.import_vectors(db, "n", f, "csv")
    with pytest.raises(FileNotFoundError, match="no file"):
        evdb.import_vectors(db, "n", tmp_path / "missing.txt", "glove")


@pytest.mark.parametrize("fmt", ["word2vec", "word2vec-binary", "npz"])
def test_export_then_import_is_bit_exact(tmp_path: Path, fmt: str) -> None:
    rng = np.random.default_rng(0)
    values = rng.standard_normal((300, 5)).astype(np.float32) * 1e-3
    tokens = [f"tok{i}·é" for i in range(300)]
    with evdb.open(tmp_path / "a") as db:
        if fmt == "npz":
            t = db.create_table("t", dim=5, dram_rows=20)
            t.upsert(np.arange(300) * 7919, values)
        else:
            t = db.create_table("t", dim=5, key_type="str", keep_strings=True, dram_rows=20)
            t.upsert(tokens, values)
        out = evdb.export(db, tmp_path / "out", format=fmt)
    src = tmp_path / "out" / out["tables"]["t"]["file"]
    with evdb.open(tmp_path / "b") as db:
        got = evdb.import_vectors(db, "t", src, fmt)
        t = db.table("t")
        assert got["rows"] == 300
        keys = np.arange(300) * 7919 if fmt == "npz" else tokens
        assert t.lookup(keys).tobytes() == values.tobytes()


def test_an_npz_import_streams(db, tmp_path: Path) -> None:
    import tracemalloc

    f = tmp_path / "big.npz"
    np.savez(f, keys=np.arange(200_000), values=np.ones((200_000, 64), np.float32))  # 51 MB
    db.create_table("t", dim=8)  # wrong dim: the import stops after its read-only first pass
    tracemalloc.start()
    with pytest.raises(evdb.ConfigError, match="has dim 8"):
        evdb.import_vectors(db, "t", f, "npz", chunk_rows=1000)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 * 2**20  # chunks of 1,000 rows, never the 51 MB of values
