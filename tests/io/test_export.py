"""Exports: every format read back by its own library (numpy, safetensors, pyarrow, evdb's
vector reader, a read-only evdb) equals the source's live rows; checksums, atomicity, bad
arguments, and memory bounded by the chunk size."""

from __future__ import annotations

import itertools
import re
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import safetensors.numpy

import evdb
from evdb.io.export import EXPORT_FORMATS, export
from evdb.io.vectors import read_vectors

DIM = 8
EXPIRED = np.arange(0, 1000)  # written at step 0; ttl_steps=2 and the step is 3: expired
LIVE = np.arange(1000, 3000)  # written (or rewritten) at step 3
ABSENT = np.arange(10**12, 10**12 + 40)
FILES = ("npz", "safetensors", "parquet")
TOKENS = [f"w{i}" for i in range(300)] + ["naïve", "日本", "x-y", "Ünïcode"]


def fill(db: evdb.Database) -> evdb.Table:
    """A table whose rows live mostly on disk, a third of them stored but expired, with
    Adagrad accumulators; a DRAM-only table without slots; an empty one."""
    rng = np.random.default_rng(7)
    t = db.create_table(
        "emb", dim=DIM, dram_rows=50, ttl_steps=2, optimizer=evdb.optim.Adagrad(lr=0.1)
    )
    t.upsert(np.arange(1500), rng.standard_normal((1500, DIM)).astype(np.float32))
    db.advance(3)
    t.upsert(LIVE, rng.standard_normal((LIVE.shape[0], DIM)).astype(np.float32))
    for start in range(1000, 3000, 400):
        p = t.pull(np.arange(start, start + 150))
        t.push(p, rng.standard_normal((p.keys.shape[0], DIM)).astype(np.float32))
    small = db.create_table("small", dim=3, disk=False, default_value=0.5)
    small.upsert([5, -7, 2**62], [[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    db.create_table("empty", dim=2)
    assert len(t) == LIVE.shape[0]
    assert t.stored_rows() > 2900  # expired rows are stored
    return t


def words(db: evdb.Database) -> evdb.Table:
    w = db.create_table("words", dim=4, key_type="str", keep_strings=True, dram_rows=50)
    values = np.random.default_rng(3).standard_normal((len(TOKENS), 4)).astype(np.float32)
    w.upsert(TOKENS, values)
    return w


def read(path: Path, fmt: str) -> dict[str, np.ndarray]:
    """The arrays of an exported file, read by the format's own library."""
    if fmt == "npz":
        with np.load(path, allow_pickle=False) as z:
            return {name: z[name] for name in z.files}
    if fmt == "safetensors":
        return safetensors.numpy.load_file(path)
    table = pq.read_table(path)
    out = {"keys": table.column("key").to_numpy()}
    for column, name in (("value", "values"), ("slots", "slots")):
        if column in table.column_names:
            flat = table.column(column).combine_chunks().flatten().to_numpy()
            out[name] = flat.reshape(table.num_rows, table.schema.field(column).type.list_size)
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("fmt", FILES)
def test_files_hold_exactly_the_live_rows(
    db: evdb.Database, tmp_path: Path, fmt: str, dtype: str
) -> None:
    t = fill(db)
    manifest = export(
        db, tmp_path / "out", format=fmt, dtype=dtype, include_slots=True, chunk_rows=300
    )
    assert manifest["kind"] == f"export-{fmt}" and manifest["step"] == 3
    assert evdb.verify(tmp_path / "out")["tables"] == manifest["tables"]
    entry = manifest["tables"]["emb"]
    assert (entry["rows"], entry["dim"], entry["key_type"]) == (2000, DIM, "int64")

    got = read(tmp_path / "out" / entry["file"], fmt)
    keys = got["keys"]
    assert keys.dtype == np.int64 and np.array_equal(np.sort(keys), LIVE)  # no expired row
    assert same_bits(got["values"], t.lookup(keys).astype(dtype))
    found, records = t.read_records(keys)
    assert found.all() and same_bits(got["slots"], records.slots)
    assert np.abs(records.slots).sum() > 0  # the pushes left real accumulators

    small = read(tmp_path / "out" / f"small.{fmt}", fmt)
    order = np.argsort(small["keys"])
    assert small["keys"][order].tolist() == [-7, 5, 2**62]
    assert small["values"][order].tolist() == [[4, 5, 6], [1, 2, 3], [7, 8, 9]]
    if fmt == "parquet":  # SGD keeps no slots; pyarrow has no zero-width lists
        assert "slots" not in small
    else:
        assert small["slots"].shape == (3, 0)
    empty = read(tmp_path / "out" / f"empty.{fmt}", fmt)
    assert empty["keys"].shape == (0,) and same_bits(empty["values"], np.empty((0, 2), dtype))


@pytest.mark.parametrize("fmt", ["serving", *FILES])
def test_float16_overflows_are_counted(db: evdb.Database, tmp_path: Path, fmt: str) -> None:
    db.create_table("t", dim=2).upsert([1, 2], [[1e6, -7e4], [1.0, 65504.0]])
    manifest = export(db, tmp_path / "out", format=fmt, dtype="float16")
    assert manifest["tables"]["t"]["float16_overflows"] == 2


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_serving_export_opens_read_only_and_reads_like_the_source(
    db: evdb.Database, tmp_path: Path, dtype: str
) -> None:
    t = fill(db)
    w = words(db)
    manifest = export(db, tmp_path / "out", dtype=dtype, chunk_rows=256)  # spills as it builds
    assert manifest["kind"] == "export-serving" and manifest["tables"]["emb"]["rows"] == 2000
    assert not (tmp_path / "out" / "LOCK").exists() and not (tmp_path / "out" / "rocksdb").exists()
    for _ in range(2):  # opening serves it and changes no checksummed file
        with evdb.open(tmp_path / "out", read_only=True) as served:
            assert served.step == db.step and served.tables() == db.tables()
            s = served.table("emb")
            assert len(s) == len(t) and len(served.table("small")) == 3
            assert s.config.optimizer == evdb.optim.SGD() and s.config.ttl_steps is None
            assert s.config.optimizer.n_slots(DIM) == 0
            assert same_bits(s.lookup(LIVE), t.lookup(LIVE).astype(dtype).astype(np.float32))
            for gone in (EXPIRED, ABSENT):  # the initializer's values, as in the source
                assert same_bits(s.lookup(gone), t.lookup(gone))
            assert served.table("small").lookup([5, 6]).tolist() == [[1, 2, 3], [0.5] * 3]
            assert served.table("words").strings(TOKENS) == TOKENS
            want = w.lookup(TOKENS).astype(dtype).astype(np.float32)
            assert same_bits(served.table("words").lookup(TOKENS), want)
            with pytest.raises(evdb.ReadOnlyError):
                s.upsert([1], np.zeros((1, DIM)))
        evdb.verify(tmp_path / "out")


@pytest.mark.parametrize("fmt", ["word2vec", "word2vec-binary"])
def test_word2vec_files_carry_the_tokens(db: evdb.Database, tmp_path: Path, fmt: str) -> None:
    w = words(db)
    manifest = export(db, tmp_path / "out", ["words"], format=fmt, chunk_rows=64)
    header, chunks = read_vectors(tmp_path / "out" / manifest["tables"]["words"]["file"], fmt)
    tokens = [tok for c in chunks for tok in c.tokens]
    assert header.declared_rows == len(TOKENS) and sorted(tokens) == sorted(TOKENS)
    _, chunks = read_vectors(tmp_path / "out" / manifest["tables"]["words"]["file"], fmt)
    values = np.concatenate([c.values for c in chunks])
    assert same_bits(values, w.lookup(tokens))


def test_a_word2vec_export_fails_on_a_row_without_a_string(
    db: evdb.Database, tmp_path: Path
) -> None:
    w = words(db)
    hashed = evdb.hash_strings(["anonymous"])
    w.upsert(hashed, np.ones((1, 4)))  # pre-hashed: the table never saw the string
    with pytest.raises(evdb.CorruptDataError, match=f"key {hashed[0]} has no string"):
        export(db, tmp_path / "out", format="word2vec")
    assert list(tmp_path.iterdir()) == [tmp_path / "db"]


def test_flipping_a_byte_of_an_export_fails_verification_naming_the_file(
    db: evdb.Database, tmp_path: Path
) -> None:
    fill(db)
    for fmt in ("npz", "serving"):
        dest = tmp_path / fmt
        manifest = export(db, dest, format=fmt)
        evdb.verify(dest)
        rel = max(manifest["files"], key=lambda f: manifest["files"][f]["size"])
        path = dest / rel
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x40
        path.write_bytes(bytes(data))
        with pytest.raises(evdb.CorruptDataError, match=re.escape(f"{path}: checksum mismatch")):
            evdb.verify(dest)
    with pytest.raises(evdb.CorruptDataError, match="checksum mismatch"):
        evdb.open(tmp_path / "serving", read_only=True)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"format": "csv"}, evdb.InvalidArgumentError, r"format must be one of .* got 'csv'"),
        ({"dtype": "float64"}, evdb.InvalidArgumentError, r"dtype must be .* got 'float64'"),
        ({"tables": ["emb", "nope"]}, evdb.TableNotFoundError, "no table 'nope'"),
        ({"tables": "emb"}, evdb.InvalidArgumentError, r"tables must be a list .* got 'emb'"),
        ({"tables": []}, evdb.InvalidArgumentError, "tables is empty"),
        ({"tables": ["emb", "emb"]}, evdb.InvalidArgumentError, r"tables\[1\]: 'emb' .* twice"),
        ({"include_slots": True}, evdb.InvalidArgumentError, "format='serving'"),
        ({"include_slots": 1}, evdb.InvalidArgumentError, "include_slots must be a bool"),
        ({"format": "word2vec"}, evdb.InvalidArgumentError, "table 'emb' has key_type='int64'"),
        (
            {"format": "word2vec-binary", "dtype": "float16", "tables": ["words"]},
            evdb.InvalidArgumentError,
            "dtype must be 'float32' for format='word2vec-binary'",
        ),
        ({"chunk_rows": 0}, evdb.InvalidArgumentError, "chunk_rows must be an int >= 1"),
        ({"progress": 3}, evdb.InvalidArgumentError, "progress must be callable"),
    ],
)
def test_bad_arguments_raise_and_write_nothing(
    db: evdb.Database, tmp_path: Path, kwargs: dict[str, Any], error: type, match: str
) -> None:
    fill(db)
    words(db)
    with pytest.raises(error, match=match):
        export(db, tmp_path / "new" / "out", **kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db"]


def test_an_existing_dest_or_a_failure_midway_leaves_nothing_behind(
    db: evdb.Database, tmp_path: Path
) -> None:
    fill(db)
    (tmp_path / "taken").mkdir()
    with pytest.raises(evdb.InvalidArgumentError, match=r"dest: .*taken already exists"):
        export(db, tmp_path / "taken", format="npz")
    assert list((tmp_path / "taken").iterdir()) == []

    def stop(done: int, total: int) -> None:
        if done > 500:
            raise KeyboardInterrupt

    for fmt in EXPORT_FORMATS[:4]:
        with pytest.raises(KeyboardInterrupt):
            export(db, tmp_path / "out", format=fmt, chunk_rows=100, progress=stop)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["db", "taken"]


def test_progress_counts_every_row_of_every_table(db: evdb.Database, tmp_path: Path) -> None:
    fill(db)
    calls: list[tuple[int, int]] = []
    export(db, tmp_path / "out", format="npz", chunk_rows=300, progress=lambda *a: calls.append(a))
    assert len(calls) > 2000 // 300 and calls[-1] == (2003, 2003)
    assert all(a[0] < b[0] and a[1] == b[1] for a, b in itertools.pairwise(calls))


def test_exporting_from_a_path_reads_the_last_flush(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = fill(db)
        want = t.lookup(LIVE)
    manifest = export(tmp_path / "db", tmp_path / "out", ["emb"], format="safetensors")
    assert manifest["step"] == 3 and list(manifest["tables"]) == ["emb"]
    got = safetensors.numpy.load_file(tmp_path / "out" / "emb.safetensors")
    order = np.argsort(got["keys"])
    assert np.array_equal(got["keys"][order], LIVE) and same_bits(got["values"][order], want)
    with evdb.open(tmp_path / "db") as db:  # the path is free again
        assert len(db.table("emb")) == LIVE.shape[0]


@pytest.mark.parametrize("fmt", ["serving", *FILES])
def test_memory_is_bounded_by_the_chunk_not_the_table(
    db: evdb.Database, tmp_path: Path, fmt: str
) -> None:
    n, dim = 40_000, 64
    t = db.create_table("big", dim=dim, dram_rows=50, optimizer=evdb.optim.Adagrad(lr=0.1))
    values = np.random.default_rng(0).standard_normal((10_000, dim)).astype(np.float32)
    for start in range(0, n, 10_000):
        t.upsert(np.arange(start, start + 10_000), values)
    del values
    table_mib = n * (8 + 2 * 4 * dim) / 2**20  # keys, values, slots: 20 MiB
    # Once untraced: the kernels compile (or load from numba's cache) on first use, and what
    # that allocates is not the export's.
    export(db, tmp_path / "warm", format=fmt, chunk_rows=500, include_slots=fmt != "serving")
    tracemalloc.start()
    try:
        export(db, tmp_path / "out", format=fmt, chunk_rows=500, include_slots=fmt != "serving")
        peak_mib = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    # 500 rows are 0.25 MiB; 2 MiB are the 1 MiB blocks of copying and checksumming files.
    assert peak_mib < 4, f"peak {peak_mib:.1f} MiB exporting a {table_mib:.0f} MiB table"
