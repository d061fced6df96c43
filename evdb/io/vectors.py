"""Pre-trained word vectors: word2vec (text and binary), GloVe and fastText ``.vec`` files.

=====================  ====================================================================
format                 layout
=====================  ====================================================================
``word2vec``           header line ``<rows> <dim>``, then ``<token> v1 ... v_dim`` per line;
``fasttext``           the token ends at the first space (the ``.vec`` text fastText writes)
``glove``              no header; ``dim`` is the number of fields of line 1 minus 1, and the
                       token is everything before the last ``dim`` fields (GloVe 840B has
                       tokens that contain spaces)
``word2vec-binary``    header line ``<rows> <dim>``, then per record the token, one space and
                       ``dim`` little-endian float32, optionally followed by ``\\n`` (the C tool
                       writes it, gensim's ``euclidean_vectors.bin`` has none)
=====================  ====================================================================

Headers are read, never trusted: a header claiming 10**12 rows allocates nothing, and a file is
read to its end whether it holds more or fewer rows than declared. Tokens are capped at 64 KiB
in every format, and a text line is read at most 64 KiB + 64 bytes a value at a time, so a
damaged file (one line of 200 MB) costs no more memory than a good one. Duplicate tokens are
yielded as they come; the caller decides. Anything malformed raises ``CorruptDataError`` naming
the file, the line (or record) and what is wrong.

This module opens a file and reads its header; the rest is split by responsibility:
:mod:`evdb.io.vector_readers` streams the rows (text and binary), :mod:`evdb.io.vector_writer`
writes files, and :mod:`evdb.io.vector_format` holds what both sides share.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterator

from evdb.errors import CorruptDataError, InvalidArgumentError
from evdb.io.vector_format import (
    FORMATS,
    TOKEN_MAX_BYTES,
    StrPath,
    VectorChunk,
    VectorHeader,
    check_format,
    show,
)
from evdb.io.vector_readers import read_binary, read_text
from evdb.io.vector_writer import write_vectors

__all__ = ["FORMATS", "VectorChunk", "VectorHeader", "read_vectors", "write_vectors"]

# The token cap, under the name evdb.io.importer imports (it refuses longer str keys up front).
_TOKEN_MAX_BYTES = TOKEN_MAX_BYTES

_BOM = b"\xef\xbb\xbf"
_HEADER_MAX_BYTES = 4096  # a "<rows> <dim>" line longer than this is not a header
_LINE1_MAX_BYTES = 16 << 20  # GloVe's line 1 gives the dim; longer than this is a damaged file


def read_vectors(
    path: StrPath, format: str, *, chunk_rows: int = 65536, encoding: str = "utf-8"
) -> tuple[VectorHeader, Iterator[VectorChunk]]:
    """Open a vector file: its header now, its rows as a stream of chunks.

    Parameters
    ----------
    path
        The file.
    format
        One of ``FORMATS``; ``"fasttext"`` is the ``.vec`` text (not fastText's ``.bin`` model).
    chunk_rows
        At most this many rows per chunk: bounds the reader's memory whatever the file's size.
    encoding
        Of the tokens, decoded strictly; an ASCII-compatible codec (a UTF-8 BOM is skipped).

    Returns
    -------
    (header, chunks)
        The header is read (and checked) before this returns; the file is opened again and
        streamed as the chunks are consumed, and closed when they are exhausted.

    Raises
    ------
    InvalidArgumentError
        An unknown format or encoding, or ``chunk_rows < 1``.
    CorruptDataError
        A malformed header (now) or row (while iterating), with the file, line and reason.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "tiny.vec")
    >>> rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    >>> write_vectors(path, "fasttext", [(["the", "of", "naïve"], rows)], rows=3, dim=2)
    >>> header, chunks = read_vectors(path, "fasttext", chunk_rows=2)
    >>> header
    VectorHeader(declared_rows=3, dim=2)
    >>> [(c.tokens, c.values.shape, c.first_line) for c in chunks]
    [(['the', 'of'], (2, 2), 2), (['naïve'], (1, 2), 4)]
    >>> tmp.cleanup()
    """
    check_format(format)
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise InvalidArgumentError(f"chunk_rows must be an int >= 1, got {chunk_rows!r}")
    encoding, skip_bom = _check_encoding(encoding)
    name = os.fspath(path)
    with open(path, "rb") as f:
        if not (skip_bom and f.read(len(_BOM)) == _BOM):
            f.seek(0)
        if format == "glove":
            offset = f.tell()
            header = VectorHeader(None, _glove_dim(f.readline(_LINE1_MAX_BYTES), name))
        else:
            where = "header (record 0)" if format == "word2vec-binary" else "line 1"
            header = _parse_header(f.readline(_HEADER_MAX_BYTES), f"{name} {where}")
            offset = f.tell()
    if format == "word2vec-binary":
        chunks = read_binary(path, name, offset, header.dim, chunk_rows, encoding)
    else:
        first = 1 if format == "glove" else 2
        chunks = read_text(path, name, offset, first, header.dim, format, chunk_rows, encoding)
    return header, chunks


# -- arguments ----------------------------------------------------------------------------


def _check_encoding(encoding: str) -> tuple[str, bool]:
    """The codec to decode tokens with, and whether to skip a UTF-8 BOM."""
    try:
        codec = codecs.lookup(encoding).name
    except (LookupError, TypeError) as e:
        raise InvalidArgumentError(f"encoding: unknown codec {encoding!r}") from e
    probe = " \n+-.0123456789eE"
    try:
        ascii_compatible = probe.encode(codec) == probe.encode("ascii")
    except UnicodeError:
        ascii_compatible = False
    if not ascii_compatible:  # lines and fields are split as bytes, before decoding
        raise InvalidArgumentError(f"encoding must be ASCII-compatible, got {encoding!r}")
    if codec in ("utf-8", "utf-8-sig"):
        return "utf-8", True
    return codec, False


# -- headers ------------------------------------------------------------------------------


def _parse_header(line: bytes, where: str) -> VectorHeader:
    fields = line.split()
    if len(fields) != 2 or not (fields[0].isdigit() and fields[1].isdigit()):
        raise CorruptDataError(
            f"{where}: expected a header '<rows> <dim>' (two integers), got {show(line)}"
        )
    rows, dim = int(fields[0]), int(fields[1])
    if dim < 1:
        raise CorruptDataError(f"{where}: dim must be at least 1, got {dim}")
    return VectorHeader(rows, dim)


def _glove_dim(line: bytes, name: str) -> int:
    """GloVe's dim: the number of fields of line 1, less the token."""
    if len(line) == _LINE1_MAX_BYTES and not line.endswith(b"\n"):
        raise CorruptDataError(f"{name} line 1: longer than {_LINE1_MAX_BYTES} bytes")
    # Read as GloVe, a word2vec file would be 1-d rows with tokens like "the 0.418 ... 0.2"
    # (tokens may hold spaces): refuse its header, even though a 1-d GloVe file could start so.
    fields = line.split()
    if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
        raise CorruptDataError(
            f"{name} line 1: {show(line.rstrip())} looks like a word2vec header, and GloVe "
            "files have none; read it with format='word2vec'"
        )
    if len(fields) < 2:
        raise CorruptDataError(
            f"{name} line 1: expected a token and values (GloVe takes the dim from line 1), "
            f"got {show(line.rstrip())}"
        )
    return len(fields) - 1
