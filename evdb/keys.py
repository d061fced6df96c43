"""Key normalisation: everything a caller passes as keys becomes a 1-D int64 array.

int64 tables take any integer array or sequence (every int64 is a valid key, no sentinels).
String tables hash UTF-8 with xxh3-64, the stable hash DESIGN.md fixes, and reinterpret the
unsigned digest as int64; an integer *numpy array* passed to a string table is taken as keys
that were hashed already (what ``hash_strings`` returns), so callers can hash once and reuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import xxhash

from evdb._types import Int64Array
from evdb.errors import InvalidArgumentError, InvalidTypeError

KeyType = Literal["int64", "str"]
KEY_TYPES: tuple[str, ...] = ("int64", "str")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def hash_strings(strings: Sequence[str], *, arg: str = "keys") -> Int64Array:
    """xxh3-64 of each string's UTF-8 bytes, as int64 (the unsigned digest reinterpreted)."""
    digest = xxhash.xxh3_64_intdigest
    out = np.empty(len(strings), dtype=np.uint64)
    try:
        out[:] = [digest(s.encode("utf-8")) for s in strings]
    except (AttributeError, TypeError):
        for i, s in enumerate(strings):
            if not isinstance(s, str):
                raise InvalidTypeError(
                    f"{arg}[{i}] is {type(s).__name__} {s!r}; a str table takes str keys"
                ) from None
        raise
    return out.view(np.int64)


def first_above_int64(arr: np.ndarray) -> int | None:
    """The index of the first element of a 1-D integer array that int64 cannot hold (an
    unsigned 64-bit value of 2**63 or more), or None. Keys are never wrapped into int64:
    2**63 is not -2**63, so ``lookup``, ``upsert`` and the importers all refuse it."""
    if arr.dtype.kind != "u" or arr.dtype.itemsize < 8:
        return None
    big = arr > np.uint64(_I64_MAX)
    return int(np.argmax(big)) if big.any() else None


def _reject(arr: np.ndarray, i: int, arg: str) -> None:
    bad = arr.reshape(-1)[i]
    raise InvalidTypeError(
        f"{arg}[{i}] is {type(bad).__name__} {bad!r}; this table takes integer keys"
    )


def _integer_array(keys: Any, arg: str) -> Int64Array:
    """Convert an integer array-like to 1-D int64, naming the first element that does not fit."""
    if isinstance(keys, (str, bytes)):
        raise InvalidTypeError(f"{arg} must hold integers, got {type(keys).__name__} {keys!r}")
    try:
        arr = keys if isinstance(keys, np.ndarray) else np.asarray(keys)
    except OverflowError:
        arr = np.asarray(keys, dtype=object)
    except TypeError as exc:  # cupy refuses an implicit copy to the host
        raise InvalidTypeError(
            f"{arg}: a {type(keys).__module__}.{type(keys).__name__} cannot be read as host "
            f"keys ({exc}); device arrays need a table whose HBM tier is on their device"
        ) from exc
    if arr.ndim != 1:
        raise InvalidArgumentError(f"{arg} must be 1-D, got shape {arr.shape}")
    if not isinstance(keys, np.ndarray) and arr.dtype.kind not in "iu" and arr.size:
        arr = np.asarray(keys, dtype=object)  # find the first bad element as the caller wrote it
    kind = arr.dtype.kind
    if arr.dtype == np.int64:
        # Kernels take C-contiguous, writable arrays (numba compiles read-only arrays, such
        # as np.frombuffer's over a request body, as another type); no copy if it is one.
        return arr if arr.flags.c_contiguous and arr.flags.writeable else np.array(arr)
    if kind == "i" or (kind == "u" and arr.dtype.itemsize < 8):
        return arr.astype(np.int64)
    if kind == "u":
        i = first_above_int64(arr)
        if i is not None:
            raise InvalidArgumentError(f"{arg}[{i}] = {arr[i]} is outside int64")
        return arr.astype(np.int64)
    if arr.size == 0:  # np.asarray([]) is float64
        return np.empty(0, dtype=np.int64)
    if kind != "O":
        _reject(arr, 0, arg)
    items = arr.tolist()
    for i, k in enumerate(items):
        if not isinstance(k, (int, np.integer)) or isinstance(k, (bool, np.bool_)):
            _reject(arr, i, arg)
        if not _I64_MIN <= int(k) <= _I64_MAX:
            raise InvalidArgumentError(f"{arg}[{i}] = {k} is outside int64")
    return np.array(items, dtype=np.int64)


def normalize_keys(keys: Any, key_type: KeyType, *, arg: str = "keys") -> Int64Array:
    """Return keys as a 1-D int64 array, or raise naming ``arg`` and its first bad element."""
    if key_type == "int64":
        return _integer_array(keys, arg)
    if isinstance(keys, np.ndarray) and keys.dtype.kind in "iu":
        return _integer_array(keys, arg)  # hashed already
    if isinstance(keys, (str, bytes)):
        raise InvalidTypeError(
            f"{arg} must be a sequence of str, got a single {type(keys).__name__}"
        )
    if isinstance(keys, np.ndarray) and keys.ndim != 1:
        raise InvalidArgumentError(f"{arg} must be 1-D, got shape {keys.shape}")
    return hash_strings(keys.tolist() if isinstance(keys, np.ndarray) else list(keys), arg=arg)
