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

This is the import path for millions of rows, so a file is streamed in chunks and no Python
runs per value: a chunk's lines are split into token and value text by C-level ``bytes``
operations, all of its values go through one ``np.fromstring`` call (binary records through
one ``np.frombuffer``), and the per-line checks are vectorised. Only when a chunk looks wrong
(or has irregular whitespace, or a GloVe token holding spaces) are its lines split one by one,
to name the first bad line. Parsing floats is then three quarters of the cost (about 0.2 us a
value); on glove.6B.50d, ``np.loadtxt``, ``map(float)`` and ``np.array(list_of_str)`` over the
split text were 8-35% slower than ``np.fromstring`` on the undecoded bytes.

Headers are read, never trusted: a header claiming 10**12 rows allocates nothing, and a file is
read to its end whether it holds more or fewer rows than declared. Tokens are capped at 64 KiB
in every format, and a text line is read at most 64 KiB + 64 bytes a value at a time, so a
damaged file (one line of 200 MB) costs no more memory than a good one. Duplicate tokens are yielded
as they come; the caller decides. Anything malformed raises ``CorruptDataError`` naming the file,
the line (or record) and what is wrong.
"""

from __future__ import annotations

import codecs
import functools
import itertools
import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from evdb._types import Float32Array
from evdb.errors import CorruptDataError, InvalidArgumentError

__all__ = ["FORMATS", "VectorChunk", "VectorHeader", "read_vectors", "write_vectors"]

FORMATS = ("word2vec", "word2vec-binary", "glove", "fasttext")

StrPath = str | os.PathLike[str]

_BOM = b"\xef\xbb\xbf"
_FILE_BUFFER_BYTES = 1 << 20
_HEADER_MAX_BYTES = 4096  # a "<rows> <dim>" line longer than this is not a header
_LINE1_MAX_BYTES = 16 << 20  # GloVe's line 1 gives the dim; longer than this is a damaged file
# word2vec's C tool caps tokens at 100 bytes; a record with no space this far in is damaged,
# and the bound keeps the binary reader's buffer small on such a file.
_TOKEN_MAX_BYTES = 1 << 16
# A text line holds a token and dim values: a value's text beyond this is not a float32 (its
# shortest exact form takes 15 bytes), and the bound keeps the text reader's lines small.
_VALUE_MAX_BYTES = 64
_TEXT_BATCH_BYTES = 4 << 20
_BINARY_BLOCK_BYTES = 1 << 20
_WHITESPACE = " \t\n\r\x0b\x0c"  # what bytes.split() splits on: ends a word2vec token
_ODD_SEPARATORS = (b"\t", b"\r", b"\x0b", b"\x0c")  # whitespace other than " "


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
    _check_format(format)
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
        chunks = _read_binary(path, name, offset, header.dim, chunk_rows, encoding)
    else:
        first = 1 if format == "glove" else 2
        chunks = _read_text(path, name, offset, first, header.dim, format, chunk_rows, encoding)
    return header, chunks


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
    _check_format(format)
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


# -- arguments ----------------------------------------------------------------------------


def _check_format(format: str) -> None:
    if format not in FORMATS:
        raise InvalidArgumentError(f"format must be one of {FORMATS}, got {format!r}")


def _check_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{name} must be an int >= {minimum}, got {value!r}")


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


# -- headers ------------------------------------------------------------------------------


def _show(data: bytes, limit: int = 60) -> str:
    """A short printable excerpt of raw file bytes for an error message."""
    text = data[:limit].decode("utf-8", "replace")
    return repr(text + ("..." if len(data) > limit else ""))


def _parse_header(line: bytes, where: str) -> VectorHeader:
    fields = line.split()
    if len(fields) != 2 or not (fields[0].isdigit() and fields[1].isdigit()):
        raise CorruptDataError(
            f"{where}: expected a header '<rows> <dim>' (two integers), got {_show(line)}"
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
            f"{name} line 1: {_show(line.rstrip())} looks like a word2vec header, and GloVe "
            "files have none; read it with format='word2vec'"
        )
    if len(fields) < 2:
        raise CorruptDataError(
            f"{name} line 1: expected a token and values (GloVe takes the dim from line 1), "
            f"got {_show(line.rstrip())}"
        )
    return len(fields) - 1


# -- text ---------------------------------------------------------------------------------


def _read_text(
    path: StrPath,
    name: str,
    offset: int,
    line_no: int,
    dim: int,
    format: str,
    chunk_rows: int,
    encoding: str,
) -> Iterator[VectorChunk]:
    glove = format == "glove"
    max_line = _TOKEN_MAX_BYTES + dim * _VALUE_MAX_BYTES + 2  # + "\r\n"
    with open(path, "rb", buffering=_FILE_BUFFER_BYTES) as f:
        f.seek(offset)
        # readline with a limit, not iteration over f, which reads a line whole however long
        # (a 200 MB "token" took 1.2 GB): a longer line is refused after max_line bytes.
        # Lines are taken in batches of at most _TEXT_BATCH_BYTES, each checked before the
        # next is read: a long line, cut into pieces, is refused at its first piece.
        bounded = iter(functools.partial(f.readline, max_line + 1), b"")
        batch = max(1, _TEXT_BATCH_BYTES // max_line)
        while True:
            lines: list[bytes] = []
            while len(lines) < chunk_rows:
                more = list(itertools.islice(bounded, min(batch, chunk_rows - len(lines))))
                if not more:
                    break
                if max(map(len, more)) > max_line:
                    _refuse_long_line(more, name, line_no + len(lines), max_line)
                lines += more
            if not lines:
                return
            chunk = _parse_text_chunk(lines, name, line_no, dim, glove, encoding)
            line_no += len(lines)
            if chunk.tokens:
                yield chunk


def _refuse_long_line(lines: list[bytes], name: str, line_no: int, max_line: int) -> None:
    """Raise naming the first of lines cut at max_line + 1 bytes (a longer line), if any."""
    for i, line in enumerate(lines):
        if len(line) > max_line and not line.endswith(b"\n"):
            if b" " not in line[: _TOKEN_MAX_BYTES + 1]:
                what = f"its token is longer than {_TOKEN_MAX_BYTES:,} bytes (64 KiB, the cap)"
            else:
                what = (
                    f"longer than {max_line:,} bytes (a token of at most 64 KiB and values of "
                    f"at most {_VALUE_MAX_BYTES} bytes each)"
                )
            raise CorruptDataError(f"{name} line {line_no + i}: {what}")


def _parse_text_chunk(
    raw: list[bytes], name: str, line_no: int, dim: int, glove: bool, encoding: str
) -> VectorChunk:
    """Parse lines at once, assuming they are regular; split them one by one where not."""
    lines = [ln.rstrip() for ln in raw]  # trailing spaces, "\r\n"
    line_nos: Sequence[int] = range(line_no, line_no + len(lines))
    if b"" in lines:
        line_nos = [no for no, ln in zip(line_nos, lines, strict=True) if ln]
        lines = [ln for ln in lines if ln]
        if not lines:
            return VectorChunk([], np.empty((0, dim), np.float32), line_no)
    m = len(lines)
    parts = [ln.partition(b" ") for ln in lines]
    tokens = [p[0] for p in parts]
    rests = [p[2] for p in parts]
    # The fast path: values separated by single spaces, so a line's spaces count its values.
    # Lines where they do not (GloVe tokens with spaces, tabs) are split again the exact way.
    # Runs of spaces can hide in a line whose spaces match, but then leave the chunk short of
    # values, never over: only then is every line split. (Looking for "  " up front costs a
    # scan that stops at every space: 6% of the read time.)
    joined = b" ".join(rests)
    if any(sep in joined for sep in _ODD_SEPARATORS):  # rare bytes: memchr scans
        odd = np.ones(m, np.bool_)
    else:
        spaces = np.fromiter(map(bytes.count, rests, itertools.repeat(b" ")), np.int64, m)
        odd = spaces != dim - 1
    ok = _resplit(lines, tokens, rests, np.flatnonzero(odd).tolist(), dim, glove)
    values = _parse_floats(b" ".join(rests) if odd.any() else joined) if ok else None
    if values is not None and values.size < m * dim and not odd.all():
        ok = _resplit(lines, tokens, rests, range(m), dim, glove)
        values = _parse_floats(b" ".join(rests)) if ok else None
    if (
        values is None
        or values.size != m * dim
        or b"" in tokens
        or max(map(len, tokens)) > _TOKEN_MAX_BYTES
        or not np.isfinite(values).all()
    ):
        _raise_first_problem(lines, line_nos, name, dim, glove, encoding)
    decoded = _decode_tokens(tokens, encoding)
    if decoded is None:
        _raise_first_problem(lines, line_nos, name, dim, glove, encoding)
    return VectorChunk(decoded, values.reshape(m, dim), line_nos[0])


def _resplit(
    lines: list[bytes],
    tokens: list[bytes],
    rests: list[bytes],
    which: Iterable[int],
    dim: int,
    glove: bool,
) -> bool:
    """Split the lines ``which`` the exact way, in place; False if one has not dim values."""
    ok = True
    for i in which:
        tokens[i], fields = _split_line(lines[i], dim, glove)
        rests[i] = b" ".join(fields)
        ok = ok and len(fields) == dim
    return ok


def _split_line(line: bytes, dim: int, glove: bool) -> tuple[bytes, list[bytes]]:
    """A stripped line's token and value fields, the slow exact way (the format's definition)."""
    if line[:1] == b" ":
        return b"", line.split()  # an empty token
    if glove:  # the token is all but the last dim fields, spaces included
        token, *fields = line.rsplit(None, dim)
        return token, fields
    token, _, rest = line.partition(b" ")
    return token, rest.split()


def _parse_floats(text: bytes) -> Float32Array | None:
    """All the numbers in whitespace-separated text, or None if any is not a number."""
    try:
        with warnings.catch_warnings():  # numpy < 2.3 warns and stops at a bad number
            warnings.simplefilter("error", DeprecationWarning)
            return np.fromstring(text, dtype=np.float32, sep=" ")
    except (ValueError, DeprecationWarning):
        return None


def _decode_tokens(tokens: list[bytes], encoding: str) -> list[str] | None:
    """Decode all tokens in one call (none holds a "\\n"); None if one is not valid."""
    try:
        decoded = b"\n".join(tokens).decode(encoding).split("\n")
        if len(decoded) != len(tokens):  # a binary token with a "\n" inside
            decoded = [t.decode(encoding) for t in tokens]
    except UnicodeDecodeError:
        return None
    return decoded


def _line_problem(line: bytes, dim: int, glove: bool, encoding: str) -> str | None:
    """What is wrong with one stripped, non-blank line, or None."""
    token, fields = _split_line(line, dim, glove)
    if not token:
        return "empty token (the line starts with a space)"
    if len(token) > _TOKEN_MAX_BYTES:
        return f"its token is longer than {_TOKEN_MAX_BYTES:,} bytes (64 KiB, the cap)"
    try:
        token.decode(encoding)
    except UnicodeDecodeError as e:
        return f"token {_show(token)} is not valid {encoding} ({e.reason} at byte {e.start})"
    if len(fields) != dim:
        return f"expected {dim} values after the token, got {len(fields)}"
    for col, field in enumerate(fields, 1):
        value = _parse_floats(field)
        if value is None or value.size != 1:
            return f"value {col} ({_show(field)}) is not a number"
        if not np.isfinite(value[0]):
            return f"value {col} ({_show(field)}) is not a finite float32"
    return None


def _raise_first_problem(
    lines: list[bytes],
    line_nos: Sequence[int],
    name: str,
    dim: int,
    glove: bool,
    encoding: str,
) -> NoReturn:
    for line, no in zip(lines, line_nos, strict=True):
        problem = _line_problem(line, dim, glove, encoding)
        if problem:
            raise CorruptDataError(f"{name} line {no}: {problem}")
    # Unreachable if the fast path and _line_problem agree; never return bad rows anyway.
    raise CorruptDataError(f"{name} lines {line_nos[0]}-{line_nos[-1]}: cannot parse")


# -- binary -------------------------------------------------------------------------------


def _read_binary(
    path: StrPath, name: str, offset: int, dim: int, chunk_rows: int, encoding: str
) -> Iterator[VectorChunk]:
    """Records through a bounded buffer: the token up to a space, then 4 * dim value bytes."""
    width = 4 * dim
    block = max(_BINARY_BLOCK_BYTES, 4 * width)
    record = 0  # records read so far; the header is record 0
    buf, pos, eof = b"", 0, False
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            tokens: list[bytes] = []
            values: list[bytes] = []
            while len(tokens) < chunk_rows:
                n = len(buf)
                while pos < n and buf[pos] == 0x0A:  # the "\n" after a record, if written
                    pos += 1
                space = buf.find(b" ", pos, pos + _TOKEN_MAX_BYTES + 1)
                end = space + 1 + width
                if space < 0 or end > n:
                    if space < 0 and n - pos > _TOKEN_MAX_BYTES:
                        raise CorruptDataError(
                            f"{name} record {record + 1}: no space in {_TOKEN_MAX_BYTES} bytes "
                            f"after {_show(buf[pos:])}; not a word2vec binary record"
                        )
                    if not eof:
                        more = f.read(block)
                        buf, pos, eof = buf[pos:] + more, 0, not more
                        continue
                    if pos == n:
                        break
                    if space < 0:
                        what = f"the file ends inside the token {_show(buf[pos:])}"
                    else:
                        token = _show(buf[pos:space])
                        what = f"token {token} has {n - space - 1} of its {width} value bytes"
                    raise CorruptDataError(f"{name} record {record + 1}: truncated: {what}")
                if space == pos:
                    raise CorruptDataError(f"{name} record {record + 1}: empty token")
                tokens.append(buf[pos:space])
                values.append(buf[space + 1 : end])
                pos = end
                record += 1
            if not tokens:
                return
            yield _binary_chunk(tokens, values, name, record - len(tokens) + 1, dim, encoding)


def _binary_chunk(
    raw_tokens: list[bytes],
    raw_values: list[bytes],
    name: str,
    first: int,
    dim: int,
    encoding: str,
) -> VectorChunk:
    m = len(raw_tokens)
    values = np.frombuffer(b"".join(raw_values), dtype="<f4").astype(np.float32).reshape(m, dim)
    finite = np.isfinite(values)
    if not finite.all():
        i, col = divmod(int(np.argmin(finite.ravel())), dim)
        raise CorruptDataError(
            f"{name} record {first + i}: value {col + 1} is {values[i, col]}, not finite"
        )
    tokens = _decode_tokens(raw_tokens, encoding)
    if tokens is None:
        for i, token in enumerate(raw_tokens):
            try:
                token.decode(encoding)
            except UnicodeDecodeError as e:
                raise CorruptDataError(
                    f"{name} record {first + i}: token {_show(token)} is not valid {encoding} "
                    f"({e.reason} at byte {e.start})"
                ) from None
        raise CorruptDataError(f"{name} records {first}-{first + m - 1}: cannot decode tokens")
    return VectorChunk(tokens, values, first)
