"""int8 / int4 serving exports: what a lookup answers is exactly the export's rows quantised
and dequantised by the kernels' reference, within half a quantisation step of the float32
rows; a key without a row answers what a float32 serving export answers; bags, scans,
neighbours; damaged files and bad arguments are refused by name, before anything is written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import evdb
from evdb.errors import CorruptDataError, InvalidArgumentError
from evdb.io.export import DTYPES, export
from evdb.kernels import backend
from evdb.quantized import QuantizedTable, is_quantized, open_quantized
from evdb.tiers.frozen import FrozenRows

BITS = {"int8": 8, "int4": 4}
N = 700
ABSENT = np.array([10**12, -5, 2**63 - 1, -(2**63)], np.int64)


def rows_of(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """Rows of varied range: some constant (scale 0), some spanning float16's range."""
    x = rng.normal(size=(n, dim)) * rng.choice([1e-3, 1.0, 50.0], size=(n, 1))
    x[0] = 0.25  # a constant row: codes all 0, the bias is the value
    x[1, :] = np.linspace(-60000, 60000, dim)  # near float16's limits
    return x.astype(np.float32)


@pytest.fixture
def source(tmp_path: Path, rng: np.random.Generator) -> tuple[Path, np.ndarray, np.ndarray]:
    """A flushed database with table "w" (dim 9: int4 packs an odd column) of N rows,
    partly on disk, and an empty table; its keys and rows."""
    keys = rng.choice(10**9, N, replace=False).astype(np.int64) - 10**8
    values = rows_of(rng, N, 9)
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("w", dim=9, dram_rows=100, initializer=evdb.init.Normal(0, 0.5, 11))
        t.upsert(keys, values)
        db.create_table("empty", dim=3, default_value=1.5)
        db.advance(4)
    return tmp_path / "db", keys, values


def quantized(values: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference's round trip of values, and each row's scale."""
    ref = backend("reference")
    dim = values.shape[1]
    q = np.zeros((values.shape[0], 4 + (dim if bits == 8 else (dim + 1) // 2)), np.uint8)
    ref.quantize_rows(values, bits, q)
    out = np.empty_like(values)
    ref.dequantize_rows(q, bits, np.arange(values.shape[0]), out)
    scale = q[:, 0:2].copy().view(np.float16).reshape(-1).astype(np.float64)
    return out, scale


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_lookup_is_the_reference_round_trip_within_half_a_step(source, tmp_path, dtype) -> None:
    path, keys, values = source
    manifest = export(path, tmp_path / "q", dtype=dtype)
    assert manifest["dtype"] == dtype and manifest["kind"] == "export-serving"
    assert manifest["tables"]["w"]["rows"] == N and is_quantized(tmp_path / "q")
    want, scale = quantized(values, BITS[dtype])
    with open_quantized(tmp_path / "q") as snap:
        t = snap.table("w")
        assert isinstance(t, QuantizedTable) and t.dtype == dtype and snap.step == 4
        order = np.random.default_rng(1).permutation(N)
        got = t.lookup(keys[order])
        np.testing.assert_array_equal(got.view(np.uint32), want[order].view(np.uint32))
        err = np.abs(got.astype(np.float64) - values[order])
        bound = scale[order, None] / 2 + np.abs(values[order]) * 2.0**-23
        assert (err <= bound).all()
        assert err.max() > 0  # it did quantise
        assert len(t) == t.count() == N and t.contains(keys).all()


def test_missing_keys_read_what_a_float32_serving_export_reads(source, tmp_path) -> None:
    path, keys, _ = source
    export(path, tmp_path / "f32")
    export(path, tmp_path / "q", dtype="int8")
    asked = np.concatenate([ABSENT, keys[:3]])
    with evdb.open(tmp_path / "f32", read_only=True) as db, open_quantized(tmp_path / "q") as q:
        for name in ("w", "empty"):
            f32, q8 = db.table(name), q.table(name)
            found = np.empty(asked.shape[0], bool)
            got = q8.lookup(asked, found=found)
            assert found.tolist() == f32.contains(asked).tolist() == q8.contains(asked).tolist()
            np.testing.assert_array_equal(got[~found], f32.lookup(asked)[~found])


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_bags_equal_a_float32_table_of_the_dequantised_rows(source, tmp_path, combiner) -> None:
    path, keys, values = source
    export(path, tmp_path / "q", dtype="int4")
    want_rows, _ = quantized(values, 4)
    asked = np.concatenate([keys[:40], ABSENT, keys[100:130]])
    offsets = [0, 5, 5, 30, 44]  # an empty bag, and bags with absent keys
    weights = np.random.default_rng(2).uniform(-1, 2, asked.shape[0]).astype(np.float32)
    with evdb.open(tmp_path / "twin") as db, open_quantized(tmp_path / "q") as q:
        twin = db.create_table("w", dim=9, initializer=evdb.init.Normal(0, 0.5, 11), disk=False)
        twin.upsert(keys, want_rows)
        t = q.table("w")
        for max_norm in (None, 0.5):
            got = t.lookup(asked, offsets, weights, combiner, max_norm)
            want = twin.lookup(asked, offsets, weights, combiner, max_norm)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        found = np.empty(asked.shape[0], bool)
        t.lookup(asked, offsets, combiner=combiner, found=found)
        assert found.tolist() == twin.contains(asked).tolist()


def test_scans_stats_and_neighbours(source, tmp_path) -> None:
    path, keys, values = source
    export(path, tmp_path / "q", dtype="int8")
    want, _ = quantized(values, 8)
    with open_quantized(tmp_path / "q") as q:
        t = q.table("w")
        chunks = list(t.items(chunk_rows=128))
        assert [k.shape[0] for k, _ in chunks] == [128] * 5 + [N - 640]
        got_keys = np.concatenate([k for k, _ in chunks])
        got = np.concatenate([v for _, v in chunks])
        order = np.argsort(got_keys)
        back = np.argsort(keys)
        np.testing.assert_array_equal(got_keys[order], keys[back])
        np.testing.assert_array_equal(got[order], want[back])
        (_, recs), *_ = t.records(1000)
        assert recs.slots.shape == (N, 0) and (recs.last_step == 4).all()
        stats = t.stats()
        assert stats["rows"] == N and stats["dtype"] == "int8"
        dram = stats["tiers"]["dram"]
        assert dram["bytes_per_row_by_component"]["values"] == 4 + 9
        assert dram["bytes_per_row"] * N == dram["bytes"] == t.nbytes
        t.lookup(np.concatenate([keys[:3], ABSENT]))
        assert t.stats()["reads"]["lookup"] == {"dram": 3, "not_found": ABSENT.shape[0]}
        near, scores = t.neighbors(int(keys[5]), k=3)
        assert int(keys[5]) not in near.tolist() and scores.shape == (3,)
        assert q.table("empty").lookup([1]).tolist() == [[1.5, 1.5, 1.5]]
        assert len(q.table("empty")) == 0 and list(q.table("empty").items()) == []
        with pytest.raises(evdb.TableNotFoundError, match="'nope'"):
            q.table("nope")
        with pytest.raises(InvalidArgumentError, match="strings"):
            t.strings([1])


def test_bad_dtype_names_the_choices_and_writes_nothing(source, tmp_path) -> None:
    path, _, _ = source
    with pytest.raises(InvalidArgumentError, match=re.escape(str(DTYPES))):
        export(path, tmp_path / "q", dtype="int2")
    assert "int8" in DTYPES and "int4" in DTYPES
    with pytest.raises(InvalidArgumentError, match="dtype='int8' needs format='serving'"):
        export(path, tmp_path / "q", format="npz", dtype="int8")
    assert not (tmp_path / "q").exists()


def test_a_table_that_keeps_strings_is_refused_naming_dtype(tmp_path) -> None:
    with evdb.open(tmp_path / "db") as db:
        db.create_table("s", dim=2, key_type="str", keep_strings=True).upsert(["a"], [[1, 2]])
        with pytest.raises(InvalidArgumentError, match="dtype='int4': table 's' keeps its"):
            export(db, tmp_path / "q", dtype="int4")
    assert not (tmp_path / "q").exists()


def test_a_value_beyond_float16_is_refused_naming_the_key(tmp_path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("w", dim=2)
        t.upsert([3, 77], [[1, 2], [1e6, 0]])
        with pytest.raises(InvalidArgumentError, match=r"table 'w': .*int8: key 77 "):
            export(db, tmp_path / "q", dtype="int8")
    assert not (tmp_path / "q").exists()


def test_str_keys_without_strings_are_served_by_their_hash(tmp_path) -> None:
    with evdb.open(tmp_path / "db") as db:
        db.create_table("s", dim=2, key_type="str").upsert(["a", "b"], [[1, 2], [3, 4]])
        export(db, tmp_path / "q", dtype="int8")
    with open_quantized(tmp_path / "q") as q:
        got = q.table("s").lookup(["b", "a"])
        np.testing.assert_allclose(got, [[3, 4], [1, 2]], atol=0.01)


def test_truncated_or_damaged_files_are_refused_by_name(source, tmp_path) -> None:
    path, _, _ = source
    export(path, tmp_path / "q", dtype="int8")
    file = tmp_path / "q" / "w.evq"
    blob = file.read_bytes()
    file.write_bytes(blob[:-100])  # truncated
    with pytest.raises(CorruptDataError, match=r"w\.evq"):
        open_quantized(tmp_path / "q")  # the manifest's sizes and checksums
    with pytest.raises(CorruptDataError, match=r"w\.evq: \d+ bytes, its header says \d+: trunc"):
        open_quantized(tmp_path / "q", verify=False)  # the file's own header
    damaged = bytearray(blob)
    damaged[len(blob) // 2] ^= 0x40  # a flipped bit in the rows
    file.write_bytes(bytes(damaged))
    with pytest.raises(CorruptDataError, match=r"w\.evq"):
        open_quantized(tmp_path / "q")
    with pytest.raises(CorruptDataError, match=r"w\.evq: checksum mismatch"):
        FrozenRows(file)
    file.write_bytes(b"EVDBFRZ1" + blob[8:20] + b"{" + blob[21:])  # a damaged header
    with pytest.raises(CorruptDataError, match=r"w\.evq: its header is damaged"):
        FrozenRows(file)
    file.write_bytes(b"not a frozen file")
    with pytest.raises(CorruptDataError, match=r"w\.evq: not an evdb frozen-rows file"):
        FrozenRows(file)


def test_the_export_is_read_only_and_verifiable(source, tmp_path) -> None:
    path, keys, _ = source
    export(path, tmp_path / "q", dtype="int4")
    assert evdb.verify(tmp_path / "q")["dtype"] == "int4"
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "q").iterdir()}
    with open_quantized(tmp_path / "q") as q:
        q.table("w").lookup(keys[:10])
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "q").iterdir()}
    assert after == before


def test_info_says_the_dtype_and_bytes_a_row(source, tmp_path) -> None:
    from evdb.kernels.reference.frozen import bucket_count
    from evdb.quantized import info

    path, _, _ = source
    export(path, tmp_path / "q", dtype="int4")
    got = info(tmp_path / "q")
    assert got["step"] == 4 and got["checkpoint"]["kind"] == "export-serving"
    w = got["tables"]["w"]
    assert (w["dim"], w["key_type"], w["rows"]) == (9, "int64", N)
    assert w["stats"]["dtype"] == "int4"
    directory = 8 * (bucket_count(N) + 1) / N  # an int64 start a bucket, 2 rows a bucket
    assert 4 < directory <= 8 + 8 / N
    beyond = w["stats"]["tiers"]["dram"]["bytes_per_row"] - (8 + 4 + 5)  # key, scale, bias, codes
    assert directory < beyond < directory + 4096 / N  # and the header, the sections' padding
    assert w["config"]["initializer"] == {"kind": "normal", "mean": 0.0, "std": 0.5, "seed": 11}
