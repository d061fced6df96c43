"""The writer behind :func:`evdb.io.vectors.write_vectors`: tokens and float32 rows as a vector
file that the readers read back exactly."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from evdb._types import Float32Array
from evdb.errors import InvalidArgumentError
from evdb.io.vector_format import StrPath, check_format

__all__ = ["write_vectors"]

_WHITESPACE = " \t\n\r\x0b\x0c"  # what bytes.split() splits on: ends a word2vec token


def write_vectors(
    path: StrPath,
    format: str,
    chunks: Iterable[tuple[list[str], np.ndarray]],
    *,
    rows: int,
    dim: int,
) -> None:
    """Write ``(tokens, values)`` chunks as a vector file that ``read_vectors`` reads back.

    Values are stored as float32: text as ``%.9g``, which round-trips every finite float32
    bit-exactly; ``word2vec-binary`` as raw little-endian float32 with a ``\\n`` after each
    record, as word2vec's C tool writes. ``"fasttext"`` is the same text as ``"word2vec"``;
    ``"glove"`` has no header. ``path`` is written in place (the caller renames atomically).

    Parameters
    ----------
    path
        The file, created or truncated.
    format
        One of ``FORMATS``.
    chunks
        ``(tokens, values)`` pairs: ``m`` str tokens and ``(m, dim)`` finite values.
    rows
        The total number of rows in ``chunks`` (the header states it before they are seen).
    dim
        The width of every row.

    Raises
    ------
    InvalidArgumentError
        A bad format, ``rows`` or ``dim``; a chunk of the wrong shape or with a non-finite
        value; a token the format cannot hold (empty, or with whitespace where the format
        splits on it). Raised before that chunk is written; when the chunks hold other than
        ``rows`` rows, it is raised after the last one, and the file's header is wrong.
    """
    check_format(format)
    _check_int("rows", rows, 0)
    _check_int("dim", dim, 1)
    glove = format == "glove"
    written = 0
    line = "%s" + " %.9g" * dim + "\n"
    with open(path, "wb") as f:
        if not glove:
            f.write(f"{rows} {dim}\n".encode("ascii"))
        for tokens, values in chunks:
            block = _check_chunk(tokens, values, dim, glove, written)
            if format == "word2vec-binary":
                blob = block.astype("<f4", copy=False).tobytes()
                width = 4 * dim
                f.write(
                    b"".join(
                        b"%s %s\n" % (t.encode("utf-8"), blob[i * width : (i + 1) * width])
                        for i, t in enumerate(tokens)
                    )
                )
            else:
                rows_text = [line % (t, *r) for t, r in zip(tokens, block.tolist(), strict=True)]
                f.write("".join(rows_text).encode("utf-8"))
            written += len(tokens)
    if written != rows:
        raise InvalidArgumentError(f"rows={rows} but the chunks held {written} rows ({path})")


def _check_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_chunk(
    tokens: list[str], values: np.ndarray, dim: int, glove: bool, first_row: int
) -> Float32Array:
    """The chunk's values as float32 rows, once its tokens and values are known writable."""
    if not isinstance(tokens, list):
        raise InvalidArgumentError(f"tokens must be a list of str, got {type(tokens).__name__}")
    arr = np.asarray(values)
    if arr.shape != (len(tokens), dim):
        raise InvalidArgumentError(
            f"row {first_row}: values must be ({len(tokens)}, {dim}) (a row per token), "
            f"got {arr.shape}"
        )
    if arr.dtype.kind not in "fiu":
        raise InvalidArgumentError(f"row {first_row}: values must be numbers, got {arr.dtype}")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow shows up as inf below
        block = np.ascontiguousarray(arr, dtype=np.float32)
    finite = np.isfinite(block)
    if not finite.all():
        i, col = divmod(int(np.argmin(finite.ravel())), dim)
        raise InvalidArgumentError(
            f"row {first_row + i} ({tokens[i]!r}): value {col + 1} is {float(arr[i, col])}, "
            "not a finite float32"
        )
    for i, token in enumerate(tokens):
        problem = _token_problem(token, glove, first_row + i == 0)
        if problem:
            raise InvalidArgumentError(f"row {first_row + i}: token {token!r} {problem}")
    if glove and first_row == 0 and dim == 1 and tokens:
        line1 = [tokens[0].encode("utf-8"), b"%.9g" % block[0, 0]]
        if line1[0].isdigit() and line1[1].isdigit():
            raise InvalidArgumentError(
                f"row 0: GloVe line 1 {b' '.join(line1).decode()!r} would read as a word2vec header"
            )
    return block


def _token_problem(token: object, glove: bool, first: bool) -> str | None:
    """Why a token cannot be written so that it reads back the same, or None."""
    if not isinstance(token, str):
        return f"is a {type(token).__name__}, not a str"
    if not token:
        return "is empty"
    try:
        token.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"is not encodable in UTF-8 ({e.reason})"
    if not glove or first:
        if any(c in token for c in _WHITESPACE):
            where = "the first GloVe token (it gives readers the dim)" if glove else "a token"
            return f"contains whitespace, which ends {where}"
    elif "\n" in token or "\r" in token:
        return "contains a line break"
    elif token[0] in _WHITESPACE or token[-1] in _WHITESPACE:
        return "starts or ends with whitespace, which GloVe readers strip"
    return None
