"""The one read both APIs make: ``lookup`` plus whether each key has a row, and the dtype
the answer's rows are sent in (float32, or float16 when the request asks)."""

from __future__ import annotations

from typing import Any

import numpy as np

from evdb.view import ReadableTable

from .codec import ApiError, short

# The dtypes an answer's rows may be sent in, by their v1 name (the first is the default).
# float16 halves the bytes on the wire; the rows are read as float32 and cast once (round to
# nearest), whatever the snapshot stores (float32, half, int8/int4), so an fp16 answer equals
# the float32 answer cast to float16 (a value past float16's range, 65504, reads inf).
ANSWER_DTYPES = ("float32", "float16")
# KServe v2 datatype -> v1 name
V2_ANSWER_DATATYPES = {"FP32": "float32", "FP16": "float16"}


def check_count(n: int, max_keys: int) -> None:
    if n > max_keys:
        raise ApiError(413, f"keys: {n} keys is more than the limit of {max_keys} per request")


def answer_dtype(field: str, value: Any, choices: tuple[str, ...] = ANSWER_DTYPES) -> str | None:
    """``value`` (a request's dtype option, None if absent) if it is one of ``choices``; else
    422 naming ``field`` and the choices."""
    if value is None or (isinstance(value, str) and value in choices):
        return value
    got = short(value) if isinstance(value, str) else type(value).__name__
    raise ApiError(422, f"{field}: expected one of {', '.join(choices)}, got {got}")


def cast_answer(embeddings: np.ndarray, dtype: str | None) -> np.ndarray:
    """The rows as sent: float32 as read, or cast to float16 (dtype "float16")."""
    if dtype is None or dtype == "float32":
        return embeddings
    with np.errstate(over="ignore"):  # past float16's range: inf, as numpy casts
        return embeddings.astype(np.float16)


def lookup_rows(
    table: ReadableTable,
    keys: np.ndarray | list[str],
    offsets: Any = None,
    weights: Any = None,
    combiner: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(embeddings, found): exactly ``Table.lookup``'s answer (a missing key reads its
    initializer value), with rows read from disk cached in DRAM (``promote=True``: the
    serving working set stays hot), and found (n,) bool per key, from the same read."""
    found = np.empty(len(keys), dtype=bool)
    embeddings = table.lookup(keys, offsets, weights, combiner, promote=True, found=found)
    return embeddings, found


def v2_datatype(requested: list[tuple[str, Any]]) -> str:
    """KServe v2: the ``embeddings`` output's datatype, "FP32" (default) or "FP16", from the
    ``datatype`` parameters a request gives, ``requested`` as (field, value) pairs in order
    of precedence (the embeddings output's own parameter, then the request's: tritonclient
    sends request parameters, ``infer(..., parameters={"datatype": "FP16"})``)."""
    for field, value in requested:
        if value is not None:
            answer_dtype(field, value, tuple(V2_ANSWER_DATATYPES))
            return str(value)
    return "FP32"
