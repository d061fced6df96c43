"""The readers behind :func:`evdb.io.vectors.read_vectors`: word2vec, fastText and GloVe text,
and word2vec binary records, streamed in chunks.

This is the import path for millions of rows, so no Python runs per value: a chunk's lines are
split into token and value text by C-level ``bytes`` operations, all of its values go through
one ``np.fromstring`` call (binary records through one ``np.frombuffer``), and the per-line
checks are vectorised. Only when a chunk looks wrong (or has irregular whitespace, or a GloVe
token holding spaces) are its lines split one by one, to name the first bad line. Parsing
floats is then three quarters of the cost (about 0.2 us a value); on glove.6B.50d,
``np.loadtxt``, ``map(float)`` and ``np.array(list_of_str)`` over the split text were 8-35%
slower than ``np.fromstring`` on the undecoded bytes.
"""

from __future__ import annotations

import functools
import itertools
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import NoReturn

import numpy as np

from evdb._types import Float32Array
from evdb.errors import CorruptDataError
from evdb.io.vector_format import TOKEN_MAX_BYTES, StrPath, VectorChunk, decode_tokens, show

__all__ = ["read_binary", "read_text"]

_FILE_BUFFER_BYTES = 1 << 20
# A text line holds a token and dim values: a value's text beyond this is not a float32 (its
# shortest exact form takes 15 bytes), and the bound keeps the text reader's lines small.
_VALUE_MAX_BYTES = 64
_TEXT_BATCH_BYTES = 4 << 20
_BINARY_BLOCK_BYTES = 1 << 20
_ODD_SEPARATORS = (b"\t", b"\r", b"\x0b", b"\x0c")  # whitespace other than " "


# -- text ---------------------------------------------------------------------------------


def read_text(
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
    max_line = TOKEN_MAX_BYTES + dim * _VALUE_MAX_BYTES + 2  # + "\r\n"
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
            if b" " not in line[: TOKEN_MAX_BYTES + 1]:
                what = f"its token is longer than {TOKEN_MAX_BYTES:,} bytes (64 KiB, the cap)"
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
        or max(map(len, tokens)) > TOKEN_MAX_BYTES
        or not np.isfinite(values).all()
    ):
        _raise_first_problem(lines, line_nos, name, dim, glove, encoding)
    decoded = decode_tokens(tokens, encoding)
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


def _line_problem(line: bytes, dim: int, glove: bool, encoding: str) -> str | None:
    """What is wrong with one stripped, non-blank line, or None."""
    token, fields = _split_line(line, dim, glove)
    if not token:
        return "empty token (the line starts with a space)"
    if len(token) > TOKEN_MAX_BYTES:
        return f"its token is longer than {TOKEN_MAX_BYTES:,} bytes (64 KiB, the cap)"
    try:
        token.decode(encoding)
    except UnicodeDecodeError as e:
        return f"token {show(token)} is not valid {encoding} ({e.reason} at byte {e.start})"
    if len(fields) != dim:
        return f"expected {dim} values after the token, got {len(fields)}"
    for col, field in enumerate(fields, 1):
        value = _parse_floats(field)
        if value is None or value.size != 1:
            return f"value {col} ({show(field)}) is not a number"
        if not np.isfinite(value[0]):
            return f"value {col} ({show(field)}) is not a finite float32"
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


def read_binary(
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
                space = buf.find(b" ", pos, pos + TOKEN_MAX_BYTES + 1)
                end = space + 1 + width
                if space < 0 or end > n:
                    if space < 0 and n - pos > TOKEN_MAX_BYTES:
                        raise CorruptDataError(
                            f"{name} record {record + 1}: no space in {TOKEN_MAX_BYTES} bytes "
                            f"after {show(buf[pos:])}; not a word2vec binary record"
                        )
                    if not eof:
                        more = f.read(block)
                        buf, pos, eof = buf[pos:] + more, 0, not more
                        continue
                    if pos == n:
                        break
                    if space < 0:
                        what = f"the file ends inside the token {show(buf[pos:])}"
                    else:
                        token = show(buf[pos:space])
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
    tokens = decode_tokens(raw_tokens, encoding)
    if tokens is None:
        for i, token in enumerate(raw_tokens):
            try:
                token.decode(encoding)
            except UnicodeDecodeError as e:
                raise CorruptDataError(
                    f"{name} record {first + i}: token {show(token)} is not valid {encoding} "
                    f"({e.reason} at byte {e.start})"
                ) from None
        raise CorruptDataError(f"{name} records {first}-{first + m - 1}: cannot decode tokens")
    return VectorChunk(tokens, values, first)
