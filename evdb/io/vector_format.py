"""What the vector readers and the writer share: the formats, the token cap, the header and
chunk types, and the small helpers both sides call (see :mod:`evdb.io.vectors`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from evdb._types import Float32Array
from evdb.errors import InvalidArgumentError

__all__ = [
    "FORMATS",
    "TOKEN_MAX_BYTES",
    "StrPath",
    "VectorChunk",
    "VectorHeader",
    "check_format",
    "decode_tokens",
    "show",
]

FORMATS = ("word2vec", "word2vec-binary", "glove", "fasttext")

StrPath = str | os.PathLike[str]

# word2vec's C tool caps tokens at 100 bytes; a record with no space this far in is damaged,
# and the bound keeps the binary reader's buffer small on such a file.
TOKEN_MAX_BYTES = 1 << 16


@dataclass(frozen=True)
class VectorHeader:
    """What a file says about itself.

    ``declared_rows`` is the header's row count (``None`` for GloVe, which has no header). It is
    never used to allocate and never checked: files whose header lies are common.
    """

    declared_rows: int | None
    dim: int


@dataclass
class VectorChunk:
    """Consecutive rows of a vector file.

    ``tokens`` are the decoded tokens in file order (duplicates kept), ``values`` the
    ``(m, dim)`` float32 C-contiguous rows, ``first_line`` the 1-based line of the first row
    (for ``word2vec-binary`` the 1-based record number; the header is record 0)::

        tiny.vec (fasttext)                  read_vectors(..., chunk_rows=2)
        line 1  3 4                          header: VectorHeader(declared_rows=3, dim=4)
        line 2  the 0.1 0.2 0.3 0.4  ─┐
        line 3  of 0.5 0.6 0.7 0.8   ─┴─>    VectorChunk(["the", "of"], (2, 4), first_line=2)
        line 4  and 0.9 1.0 1.1 1.2  ───>    VectorChunk(["and"], (1, 4), first_line=4)

    Blank lines carry no row and are skipped, so the rows of a chunk need not be on
    consecutive lines.
    """

    tokens: list[str]
    values: Float32Array
    first_line: int


def check_format(format: str) -> None:
    if format not in FORMATS:
        raise InvalidArgumentError(f"format must be one of {FORMATS}, got {format!r}")


def show(data: bytes, limit: int = 60) -> str:
    """A short printable excerpt of raw file bytes for an error message."""
    text = data[:limit].decode("utf-8", "replace")
    return repr(text + ("..." if len(data) > limit else ""))


def decode_tokens(tokens: list[bytes], encoding: str) -> list[str] | None:
    """Decode all tokens in one call (none holds a "\\n"); None if one is not valid."""
    try:
        decoded = b"\n".join(tokens).decode(encoding).split("\n")
        if len(decoded) != len(tokens):  # a binary token with a "\n" inside
            decoded = [t.decode(encoding) for t in tokens]
    except UnicodeDecodeError:
        return None
    return decoded
