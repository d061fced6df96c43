"""Key normalisation: every int64 is a key; bad keys are named with their position."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

from evdb.errors import InvalidArgumentError, InvalidTypeError
from evdb.keys import hash_strings, normalize_keys


def test_integer_inputs_become_int64_unchanged() -> None:
    edge = [0, -1, 2**63 - 1, -(2**63)]
    assert normalize_keys(edge, "int64").tolist() == edge
    assert normalize_keys(np.array([1, 2], np.uint32), "int64").dtype == np.int64
    assert normalize_keys(np.array([2**63 - 1], np.uint64), "int64").tolist() == [2**63 - 1]
    assert normalize_keys([], "int64").shape == (0,)
    arr = np.array([5, 6], dtype=np.int64)
    assert normalize_keys(arr, "int64") is arr  # no copy on the hot path


def test_read_only_and_strided_key_arrays_reach_the_kernels(tmp_path) -> None:
    """np.frombuffer over a request body is read-only: numba types it apart, so it is copied
    (a REST lookup of raw int64 bytes failed with a TypeError before)."""
    import evdb

    body = np.array([3, 7, 3], dtype="<i8").tobytes()
    keys = np.frombuffer(body, dtype="<i8")
    assert not keys.flags.writeable
    got = normalize_keys(keys, "int64")
    assert got.flags.writeable and got.tolist() == [3, 7, 3]
    strided = np.arange(6, dtype=np.int64)[::2]
    assert normalize_keys(strided, "int64").flags.c_contiguous
    with evdb.open(tmp_path) as db:
        t = db.create_table("t", dim=2)
        t.upsert([3], np.ones((1, 2), np.float32))
        np.testing.assert_array_equal(t.lookup(keys), t.lookup(keys.copy()))
        assert t.contains(keys).tolist() == [True, False, True]
        assert t.pull(keys).keys.tolist() == [3, 7]


@pytest.mark.parametrize(
    "keys,error,message",
    [
        ([1, 2.5], InvalidTypeError, r"keys\[1\] is float 2.5"),
        ([1, "a"], InvalidTypeError, r"keys\[1\] is str 'a'"),
        (np.array([1.0, 2.0]), InvalidTypeError, r"keys\[0\]"),
        (np.array([True]), InvalidTypeError, r"keys\[0\]"),
        ([[1, 2]], InvalidArgumentError, r"keys must be 1-D, got shape \(1, 2\)"),
        ([3, 2**64], InvalidArgumentError, r"keys\[1\] = 18446744073709551616 is outside int64"),
        (np.array([0, 2**63], np.uint64), InvalidArgumentError, r"keys\[1\] = 9223372036854775808"),
        ("abc", InvalidTypeError, "must hold integers"),
    ],
)
def test_bad_integer_keys_name_the_first_bad_element(keys, error, message) -> None:
    with pytest.raises(error, match=message):
        normalize_keys(keys, "int64")


def test_string_keys_hash_with_xxh3_64_of_utf8() -> None:
    words = ["a", "hello", "हि", ""]
    want = [xxhash.xxh3_64_intdigest(w.encode()) for w in words]
    got = normalize_keys(words, "str")
    assert got.view(np.uint64).tolist() == want
    # pre-hashed keys pass through a str table unchanged
    assert normalize_keys(hash_strings(words), "str").tolist() == got.tolist()


def test_bad_string_keys_name_the_first_bad_element() -> None:
    with pytest.raises(InvalidTypeError, match=r"keys\[2\] is int 3"):
        normalize_keys(["a", "b", 3], "str")
    with pytest.raises(InvalidTypeError, match="single str"):
        normalize_keys("abc", "str")
