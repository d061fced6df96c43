"""Imports that never lie (issue 26, item 7): what a file holds either imports exactly or is
refused with an evdb error naming the file and the first bad element, never wrapped, never a
numpy traceback, never a token of unbounded size, and a failed import leaves nothing behind.
"""

from __future__ import annotations

import io
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

import evdb
from evdb import offline
from tests.test_cli import evdb_cli


def write_npz(path: Path, **members: bytes) -> None:
    """An npz whose members are the given raw .npy bytes (headers may lie)."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(f"{name}.npy", data)


def npy(array: np.ndarray, header_shape: tuple[int, ...] | None = None, descr: str = "") -> bytes:
    """array as .npy bytes, with its header's shape and dtype overridden when given."""
    header = np.lib.format.header_data_from_array_1_0(array)
    if header_shape is not None:
        header["shape"] = header_shape
    if descr:
        header["descr"] = descr
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    out.write(array.tobytes())
    return out.getvalue()


VALUES = np.ones((3, 2), np.float32)


def test_uint64_keys_at_or_above_2_63_are_refused_naming_the_first(db, tmp_path: Path) -> None:
    src = tmp_path / "big.npz"
    keys = np.array([1, 2**63 - 1, 2**63, 2**64 - 1], dtype=np.uint64)
    np.savez(src, keys=keys, values=np.ones((4, 2), np.float32))
    with pytest.raises(
        evdb.InvalidArgumentError,
        match=r"big\.npz: keys\[2\] = 9223372036854775808 is outside int64",
    ):
        evdb.import_vectors(db, "t", src, "npz")
    assert "t" not in db.tables()
    # the same rule as every lookup: the library API and the importer agree
    db.create_table("u", dim=2)
    with pytest.raises(evdb.InvalidArgumentError, match=r"keys\[2\] = 9223372036854775808"):
        db.table("u").lookup(keys)
    below = tmp_path / "below.npz"  # up to 2**63 - 1, uint64 keys import as they are
    np.savez(below, keys=keys[:2], values=np.ones((2, 2), np.float32))
    evdb.import_vectors(db, "t", below, "npz")
    assert sorted(np.concatenate([k for k, _ in db.table("t").items()]).tolist()) == [1, 2**63 - 1]


@pytest.mark.parametrize("short", ["keys", "values"])
def test_an_npz_header_declaring_more_rows_than_it_holds_is_corrupt(
    db, tmp_path: Path, short: str
) -> None:
    src = tmp_path / "short.npz"
    n = 1000
    keys, values = np.arange(n, dtype=np.int64), np.ones((n, 2), np.float32)
    arrays = {"keys": npy(keys), "values": npy(values)}
    if short == "keys":
        arrays["keys"] = npy(keys[:3], header_shape=(n,))
    else:
        arrays["values"] = npy(values[:3], header_shape=(n, 2))
    write_npz(src, **arrays)
    with pytest.raises(evdb.CorruptDataError, match=rf"short\.npz: array '{short}'.* 1,000 rows"):
        evdb.import_vectors(db, "t", src, "npz")
    assert "t" not in db.tables()


def test_an_absurd_string_keys_dtype_is_refused_before_reading(db, tmp_path: Path) -> None:
    src = tmp_path / "wide.npz"
    keys = np.array(["a", "b", "c"], dtype="<U1")
    write_npz(src, keys=npy(keys, descr="<U100000000"), values=npy(VALUES))
    with pytest.raises(evdb.CorruptDataError, match=r"wide\.npz: keys dtype <U100000000"):
        evdb.import_vectors(db, "t", src, "npz")


def test_a_damaged_compressed_npz_is_corrupt_not_a_zip_traceback(db, tmp_path: Path) -> None:
    src = tmp_path / "damaged.npz"
    rng = np.random.default_rng(0)
    np.savez_compressed(src, keys=np.arange(5000), values=rng.random((5000, 8), np.float32))
    data = bytearray(src.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the compressed values
    src.write_bytes(bytes(data))
    with pytest.raises(evdb.CorruptDataError, match=r"damaged\.npz"):
        evdb.import_vectors(db, "t", src, "npz")


def test_a_text_token_longer_than_64_kib_is_refused_naming_its_line(db, tmp_path: Path) -> None:
    src = tmp_path / "long.txt"
    src.write_bytes(b"2 2\nok 1 2\n" + b"x" * (64 * 1024 + 1) + b" 3 4\n")
    with pytest.raises(evdb.CorruptDataError, match=r"long\.txt line 3: its token is longer"):
        evdb.import_vectors(db, "t", src, "word2vec")
    assert "t" not in db.tables()


def test_a_huge_token_line_is_refused_after_a_bounded_read(db, tmp_path: Path) -> None:
    src = tmp_path / "huge.vec"
    src.write_bytes(b"ok 1 2\n" + b"y" * (32 << 20) + b" 3 4\n")  # one 32 MB line
    tracemalloc.start()
    try:
        with pytest.raises(evdb.CorruptDataError, match=r"huge\.vec line 2: its token is longer"):
            evdb.import_vectors(db, "t", src, "glove")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # a line is read 64 KiB + 64 bytes a value at a time, never whole


def test_a_failed_import_removes_the_database_directory_it_created(tmp_path: Path) -> None:
    src = tmp_path / "bad.txt"
    src.write_bytes(b"2 2\nok 1 2\nbad 1 x\n")
    target = tmp_path / "new" / "db"
    with pytest.raises(evdb.CorruptDataError, match=r"bad\.txt line 3"):
        offline.import_file(target, "t", src, "word2vec")
    assert not (tmp_path / "new").exists()  # nor the parent it made
    done = evdb_cli("import", src, target, "--table", "t", "--format", "word2vec")
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "new").exists()


def test_a_failed_import_never_removes_a_database_that_existed(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        db.create_table("keep", dim=2).upsert([1], [[1.0, 2.0]])
    src = tmp_path / "bad.npz"
    np.savez(src, keys=np.array([2**63], np.uint64), values=np.ones((1, 2), np.float32))
    with pytest.raises(evdb.InvalidArgumentError, match="outside int64"):
        offline.import_file(tmp_path / "db", "t", src, "npz")
    with evdb.open(tmp_path / "db", read_only=True) as db:
        assert db.tables() == ["keep"] and len(db.table("keep")) == 1


def test_evdb_import_of_a_lying_npz_prints_one_line(tmp_path: Path) -> None:
    src = tmp_path / "short.npz"
    write_npz(src, keys=npy(np.arange(3), header_shape=(9,)), values=npy(VALUES, (9, 2)))
    done = evdb_cli("import", src, tmp_path / "db", "--table", "t", "--format", "npz", "--json")
    assert done.returncode == 3, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.startswith("evdb: error: ") and done.stderr.count("\n") == 1
    assert not (tmp_path / "db").exists()
