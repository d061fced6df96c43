"""Word-vector files: real files against a plain parser, round trips, and every malformed case.

The plain parsers below read a whole file line by line (or with ``struct``): slow, obvious, and
independent of the chunked numpy reader they check.
"""

from __future__ import annotations

import struct
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from evdb.errors import CorruptDataError, InvalidArgumentError
from evdb.io.vectors import FORMATS, VectorHeader, read_vectors, write_vectors

_SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
DATA = _SHARED if _SHARED.is_dir() else Path(__file__).resolve().parents[1] / "data" / "shared"

# (file under DATA, format, rows, dim): the rows and dims data/README.md states.
REAL_FILES = [
    ("gensim-test-data/word2vec_pre_kv_c", "word2vec", 1750, 10),
    ("gensim-test-data/EN.1-10.cbow1_wind5_hs0_neg10_size300_smpl1e-05.txt", "word2vec", 20, 300),
    ("gensim-test-data/lee_fasttext.vec", "fasttext", 1762, 10),
    ("gensim-test-data/toy-model.vec", "fasttext", 22, 5),
    ("gensim-test-data/crime-and-punishment.vec", "fasttext", 291, 5),
    ("gensim-test-data/test_glove.txt", "glove", 76, 50),
    ("glove/glove.6B.50d.top10k.txt", "glove", 10000, 50),
    ("gensim-test-data/euclidean_vectors.bin", "word2vec-binary", 2747, 10),
]


def real_file(name: str) -> Path:
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{path} is not on this machine")
    return path


def read_all(path: Path, fmt: str, **kw: object):  # type: ignore[no-untyped-def]
    """Header, all tokens, all values (n, dim) and the chunks themselves."""
    header, stream = read_vectors(path, fmt, **kw)  # type: ignore[arg-type]
    chunks = list(stream)
    tokens = [t for c in chunks for t in c.tokens]
    values = (
        np.concatenate([c.values for c in chunks])
        if chunks
        else np.empty((0, header.dim), np.float32)
    )
    return header, tokens, values, chunks


# -- plain parsers --------------------------------------------------------------------------


def plain_text(path: Path, fmt: str) -> list[tuple[str, list[float]]]:
    lines = path.read_text(encoding="utf-8").split("\n")
    if fmt != "glove":
        lines = lines[1:]
    rows = []
    dim = None
    for line in lines:
        fields = line.rstrip().split(" ")
        if fields == [""]:
            continue
        if dim is None:
            dim = len(fields) - 1
        rows.append((" ".join(fields[:-dim]), [float(x) for x in fields[-dim:]]))
    return rows


def plain_binary(path: Path) -> list[tuple[str, list[float]]]:
    data = path.read_bytes()
    header, _, body = data.partition(b"\n")
    _, dim = (int(x) for x in header.split())
    rows = []
    pos = 0
    while pos < len(body):
        if body[pos : pos + 1] == b"\n":
            pos += 1
            continue
        space = body.index(b" ", pos)
        values = struct.unpack(f"<{dim}f", body[space + 1 : space + 1 + 4 * dim])
        rows.append((body[pos:space].decode("utf-8"), list(values)))
        pos = space + 1 + 4 * dim
    return rows


@pytest.mark.parametrize("name,fmt,rows,dim", REAL_FILES, ids=[f[0] for f in REAL_FILES])
def test_real_files_match_a_plain_parser(name: str, fmt: str, rows: int, dim: int) -> None:
    path = real_file(name)
    expected = plain_binary(path) if fmt == "word2vec-binary" else plain_text(path, fmt)
    header, tokens, values, _ = read_all(path, fmt)
    assert header.dim == dim
    assert header.declared_rows == (None if fmt == "glove" else rows)
    assert len(tokens) == len(expected) == values.shape[0] == rows
    assert tokens == [t for t, _ in expected]
    want = np.array([v for _, v in expected[:5]], dtype=np.float32)
    np.testing.assert_array_equal(values[:5], want)
    np.testing.assert_array_equal(values[-1], np.array(expected[-1][1], dtype=np.float32))
    assert values.dtype == np.float32 and values.flags.c_contiguous


def test_real_files_keep_their_non_ascii_tokens() -> None:
    _, tokens, _, _ = read_all(real_file("gensim-test-data/test_glove.txt"), "glove")
    assert tokens[1:3] == ["ö", "é"] and "हु" in tokens
    _, tokens, _, _ = read_all(real_file("gensim-test-data/crime-and-punishment.vec"), "fasttext")
    assert tokens[:3] == ["и", "в", "на"]


@pytest.mark.parametrize("name,fmt,rows,dim", REAL_FILES, ids=[f[0] for f in REAL_FILES])
def test_small_chunks_give_the_same_rows(name: str, fmt: str, rows: int, dim: int) -> None:
    path = real_file(name)
    _, tokens, values, chunks = read_all(path, fmt)
    _, tokens2, values2, chunks2 = read_all(path, fmt, chunk_rows=7)
    assert tokens2 == tokens
    np.testing.assert_array_equal(values2, values)
    first = 1 if fmt in ("glove", "word2vec-binary") else 2  # text with a header: line 2
    assert [c.first_line for c in chunks2] == list(range(first, first + rows, 7))
    assert all(len(c.tokens) == c.values.shape[0] <= 7 for c in chunks2)
    assert len(chunks) == 1


# -- round trips ----------------------------------------------------------------------------

EDGE_VALUES = np.array(
    [
        [0.0, -0.0, 1.0, -1.0],
        [np.finfo(np.float32).max, -np.finfo(np.float32).max, 1e-45, -1e-45],  # 1e-45: subnormal
        [np.finfo(np.float32).tiny, 0.1, 1 / 3, 3.4028e38],
        [0.418, -6.3681e-05, 123456789.0, 2.5e-30],
    ],
    dtype=np.float32,
)


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_is_bit_exact(tmp_path: Path, fmt: str) -> None:
    tokens = ["the", "naïve", "Привет", "中文", "😀", "a\xa0b", "the"]  # a duplicate, kept
    if fmt == "glove":
        tokens[3] = ". . ."  # GloVe 840B has tokens with spaces (not on line 1)
    rng = np.random.default_rng(0)
    values = np.concatenate([EDGE_VALUES, rng.standard_normal((3, 4), dtype=np.float32)])
    path = tmp_path / "vectors"
    write_vectors(path, fmt, [(tokens[:3], values[:3]), (tokens[3:], values[3:])], rows=7, dim=4)
    header, got_tokens, got, chunks = read_all(path, fmt, chunk_rows=3)
    assert header == VectorHeader(None if fmt == "glove" else 7, 4)
    assert got_tokens == tokens
    np.testing.assert_array_equal(got.view(np.uint32), values.view(np.uint32))
    first = 2 if fmt in ("word2vec", "fasttext") else 1  # text headers are line 1
    assert [c.first_line for c in chunks] == [first, first + 3, first + 6]
    if fmt == "word2vec-binary":  # raw little-endian float32, a "\n" after each record
        record = b"the " + values[0].astype("<f4").tobytes() + b"\n"
        assert path.read_bytes().startswith(b"7 4\n" + record + "naïve ".encode())


def test_text_values_are_written_as_9_significant_digits(tmp_path: Path) -> None:
    path = tmp_path / "v.txt"
    write_vectors(path, "word2vec", [(["a"], np.array([[0.1, 1.0]], np.float32))], rows=1, dim=2)
    assert path.read_bytes() == b"1 2\na 0.100000001 1\n"


def _token(glove_inner_spaces: bool) -> st.SearchStrategy[str]:
    bare = st.text(
        st.characters(exclude_categories=["Cs"], exclude_characters=" \t\n\r\x0b\x0c"),
        min_size=1,
        max_size=8,
    )
    if not glove_inner_spaces:
        return bare
    return st.one_of(bare, st.builds(lambda a, b: f"{a} {b}", bare, bare))


@st.composite
def vector_files(draw: st.DrawFn) -> tuple[str, list[str], np.ndarray, int]:
    fmt = draw(st.sampled_from(FORMATS))
    dim = draw(st.integers(1, 6))
    n = draw(st.integers(1 if fmt == "glove" else 0, 12))
    first = draw(_token(False))
    tokens = [
        first,
        *draw(st.lists(_token(fmt == "glove"), min_size=max(n - 1, 0), max_size=max(n - 1, 0))),
    ][:n]
    values = draw(
        hnp.arrays(
            np.float32,
            (n, dim),
            elements=st.floats(width=32, allow_nan=False, allow_infinity=False),
        )
    )
    return fmt, tokens, values, draw(st.integers(1, 5))


@given(vector_files())
def test_round_trip_property(case: tuple[str, list[str], np.ndarray, int]) -> None:
    fmt, tokens, values, chunk_rows = case
    n, dim = values.shape
    # "7 0" on line 1 of a 1-d GloVe file would read as a header: write_vectors refuses it
    assume(not (fmt == "glove" and dim == 1 and tokens[0].isdigit() and values[0, 0] % 1 == 0))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v"
        halves = [(tokens[: n // 2], values[: n // 2]), (tokens[n // 2 :], values[n // 2 :])]
        write_vectors(path, fmt, halves, rows=n, dim=dim)
        header, got_tokens, got, chunks = read_all(path, fmt, chunk_rows=chunk_rows)
    assert header.dim == dim
    assert got_tokens == tokens
    np.testing.assert_array_equal(got.view(np.uint32), values.view(np.uint32))
    assert all(len(c.tokens) <= chunk_rows for c in chunks)


# -- the traps real files have --------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["word2vec", "word2vec-binary"])
def test_a_header_claiming_10_to_the_12_rows_allocates_nothing(tmp_path: Path, fmt: str) -> None:
    dim = 32  # a reader that preallocated even min(declared, chunk_rows) rows would use 8 MiB
    rows = np.arange(3 * dim, dtype=np.float32).reshape(3, dim)
    path = tmp_path / "liar"
    write_vectors(path, fmt, [(["a", "b", "c"], rows)], rows=3, dim=dim)
    body = path.read_bytes().partition(b"\n")[2]
    path.write_bytes(f"{10**12} {dim}\n".encode() + body)
    tracemalloc.start()
    try:
        header, tokens, values, _ = read_all(path, fmt)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert header.declared_rows == 10**12
    assert tokens == ["a", "b", "c"]
    np.testing.assert_array_equal(values, rows)
    assert peak < 4 << 20


@pytest.mark.parametrize("fmt", ["word2vec", "word2vec-binary"])
def test_a_header_claiming_too_few_rows_is_read_to_the_end(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "liar"
    write_vectors(path, fmt, [(["a", "b", "c"], np.eye(3, dtype=np.float32))], rows=3, dim=3)
    path.write_bytes(b"1 3\n" + path.read_bytes().partition(b"\n")[2])
    header, tokens, _, _ = read_all(path, fmt)
    assert header.declared_rows == 1 and tokens == ["a", "b", "c"]


def test_binary_records_with_and_without_newlines(tmp_path: Path) -> None:
    # Values whose bytes hold spaces and newlines: a reader must count bytes, not look for them.
    tricky = np.frombuffer(b"\n \n \n\n  \n\n\n ", dtype="<f4").astype(np.float32)
    values = np.stack([tricky, tricky[::-1], -tricky])
    blob = [v.astype("<f4").tobytes() for v in values]
    path = tmp_path / "mixed.bin"
    path.write_bytes(
        b"3 3\r\n"  # a Windows-written header
        + b"one "
        + blob[0]  # no "\n" (gensim's euclidean_vectors.bin)
        + "два ".encode()
        + blob[1]
        + b"\n\n"  # the C tool's "\n", and a stray one
        + b"three "
        + blob[2]
    )
    for chunk_rows in (1, 2, 10):
        header, tokens, got, chunks = read_all(path, "word2vec-binary", chunk_rows=chunk_rows)
        assert header == VectorHeader(3, 3)
        assert tokens == ["one", "два", "three"]
        np.testing.assert_array_equal(got, values)
        assert [c.first_line for c in chunks] == list(range(1, 4, chunk_rows))


def test_real_binary_file_has_no_newlines_between_records() -> None:
    path = real_file("gensim-test-data/euclidean_vectors.bin")
    body = path.read_bytes().partition(b"\n")[2]
    assert body[: 4 + 40 + 3] == b"the " + body[4:44] + b"to "  # the trap is real


@pytest.mark.parametrize("fmt", ["word2vec", "fasttext", "glove"])
def test_trailing_spaces_crlf_and_blank_lines(tmp_path: Path, fmt: str) -> None:
    header = b"" if fmt == "glove" else b"3 2\r\n"
    path = tmp_path / "v.txt"
    path.write_bytes(header + b"a 1 2 \r\nb 3 4\r\n\r\nc 5 6e0  \r\n\r\n")
    _, tokens, values, chunks = read_all(path, fmt, chunk_rows=2)
    assert tokens == ["a", "b", "c"]
    np.testing.assert_array_equal(values, np.array([[1, 2], [3, 4], [5, 6]], np.float32))
    first = 1 if fmt == "glove" else 2
    assert [c.first_line for c in chunks] == [first, first + 3]  # the blank line is counted


def test_word2vec_accepts_runs_of_spaces_and_tabs_between_values(tmp_path: Path) -> None:
    path = tmp_path / "v.txt"
    path.write_bytes(b"3 2\r\na 1 2 \r\nb  3\t4\r\n\r\nc 5 6e0  \r\n")
    _, tokens, values, chunks = read_all(path, "word2vec", chunk_rows=2)
    assert tokens == ["a", "b", "c"]
    np.testing.assert_array_equal(values, np.array([[1, 2], [3, 4], [5, 6]], np.float32))
    assert [c.first_line for c in chunks] == [2, 5]  # line 4 is blank


def test_glove_tokens_with_spaces_are_split_from_the_right(tmp_path: Path) -> None:
    path = tmp_path / "glove.txt"
    path.write_bytes(b", 1 2\n. . . 3 4\nat  name 5 6\n")
    _, tokens, values, _ = read_all(path, "glove")
    assert tokens == [",", ". . .", "at  name"]
    np.testing.assert_array_equal(values, np.array([[1, 2], [3, 4], [5, 6]], np.float32))


def test_a_utf8_bom_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbfthe 1 2\n")
    _, tokens, _, _ = read_all(path, "glove")
    assert tokens == ["the"]


def test_other_ascii_compatible_encodings(tmp_path: Path) -> None:
    path = tmp_path / "latin1.vec"
    path.write_bytes(b"1 2\nna\xefve 1 2\n")
    _, tokens, _, _ = read_all(path, "word2vec", encoding="latin-1")
    assert tokens == ["naïve"]
    with pytest.raises(CorruptDataError, match=r"line 2: token 'na.ve' is not valid utf-8"):
        read_all(path, "word2vec")


def test_rows_errors_come_when_iterating_header_errors_at_once(tmp_path: Path) -> None:
    path = tmp_path / "v.txt"
    path.write_bytes(b"1 2\na 1\n")
    header, chunks = read_vectors(path, "word2vec")
    assert header == VectorHeader(1, 2)
    with pytest.raises(CorruptDataError):
        next(chunks)
    path.write_bytes(b"one 2\na 1\n")
    with pytest.raises(CorruptDataError):
        read_vectors(path, "word2vec")


# -- malformed files ------------------------------------------------------------------------


def corrupt(tmp_path: Path, content: bytes, fmt: str, name: str = "bad.txt", **kw: object) -> str:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CorruptDataError) as e:
        read_all(path, fmt, **kw)
    message = str(e.value)
    assert message.startswith(f"{path} "), message
    return message[len(str(path)) + 1 :]


def test_the_glove_example_message(tmp_path: Path) -> None:
    rows = [f"w{i} " + " ".join(["0.5"] * (49 if i == 7 else 50)) for i in range(1, 10)]
    message = corrupt(tmp_path, "\n".join(rows).encode(), "glove", name="glove.txt")
    assert message == "line 7: expected 50 values after the token, got 49"


W2V = b"4 3\na 1 2 3\n"
BAD_TEXT = [
    # (format, file, expected message after the path)
    ("word2vec", W2V + b"b 1 2\n", "line 3: expected 3 values after the token, got 2"),
    (
        "fasttext",
        W2V + b"b 1 2 3 \nc 1 2 3 4\n",
        "line 4: expected 3 values after the token, got 4",
    ),
    ("word2vec", W2V + b"b\n", "line 3: expected 3 values after the token, got 0"),
    ("glove", b"a 1 2 3\nb 1 2\n", "line 2: expected 3 values after the token, got 2"),
    ("word2vec", W2V + b"b 1 x 3\n", "line 3: value 2 ('x') is not a number"),
    ("word2vec", W2V + b"b 1 2,5 3\n", "line 3: value 2 ('2,5') is not a number"),
    ("glove", b"a 1 2 3\nb 1 2 3\nc 1 2 0x3\n", "line 3: value 3 ('0x3') is not a number"),
    ("word2vec", W2V + b" 1 2 3\n", "line 3: empty token (the line starts with a space)"),
    ("glove", b"a 1 2 3\n 1 2 3\n", "line 2: empty token (the line starts with a space)"),
    ("word2vec", W2V + b"b 1 nan 3\n", "line 3: value 2 ('nan') is not a finite float32"),
    ("glove", b"a 1 2 3\nb -inf 2 3\n", "line 2: value 1 ('-inf') is not a finite float32"),
    ("word2vec", W2V + b"b 1 2 1e39\n", "line 3: value 3 ('1e39') is not a finite float32"),
    ("fasttext", W2V + b"\xff\xfe 1 2 3\n", "line 3: token '\ufffd\ufffd' is not valid utf-8"),
    # a run of spaces where a value is missing; a tab hiding an extra value
    ("word2vec", W2V + b"b 1  2\n", "line 3: expected 3 values after the token, got 2"),
    (
        "word2vec",
        W2V + b"b 1 2 3\nc 1\t2 3 4\n",
        "line 4: expected 3 values after the token, got 4",
    ),
    ("word2vec", W2V + b"b 1  2\nc 1\t2 3 4\n", "line 3: expected 3 values after the token, got 2"),
    # the first bad line is named, whatever its kind
    ("word2vec", W2V + b"b 1 x 3\nc 1\n", "line 3: value 2 ('x') is not a number"),
    ("word2vec", W2V + b"b 1\nc 1 x 3\n", "line 3: expected 3 values after the token, got 1"),
    # blank lines are skipped but counted
    ("word2vec", W2V + b"\n\r\nb 1 2\n", "line 5: expected 3 values after the token, got 2"),
    # headers
    ("word2vec", b"", "line 1: expected a header '<rows> <dim>' (two integers), got ''"),
    ("word2vec", b"4\na 1\n", "line 1: expected a header '<rows> <dim>' (two integers)"),
    ("fasttext", b"four 3\n", "line 1: expected a header '<rows> <dim>' (two integers)"),
    ("word2vec", b"4 3 1\n", "line 1: expected a header '<rows> <dim>' (two integers)"),
    ("word2vec", b"4 -3\n", "line 1: expected a header '<rows> <dim>' (two integers)"),
    ("word2vec", b"the 1 2 3\n", "line 1: expected a header '<rows> <dim>' (two integers)"),
    ("word2vec", b"4 0\n", "line 1: dim must be at least 1, got 0"),
    ("glove", b"400000 50\nthe 1 2\n", "line 1: '400000 50' looks like a word2vec header"),
    ("glove", b"the\n", "line 1: expected a token and values"),
    ("glove", b"", "line 1: expected a token and values"),
]


@pytest.mark.parametrize("fmt,content,expected", BAD_TEXT)
def test_malformed_text_names_file_line_and_fault(
    tmp_path: Path, fmt: str, content: bytes, expected: str
) -> None:
    assert corrupt(tmp_path, content, fmt).startswith(expected)


def test_a_fault_in_a_later_chunk_names_its_line(tmp_path: Path) -> None:
    content = W2V + b"b 1 2 3\nc 1 2 3\nd 1 2 3\ne 1 2 3\nf 1 2 3\ng 1 2 inf\n"
    for chunk_rows in (1, 2, 3, 100):
        message = corrupt(tmp_path, content, "word2vec", chunk_rows=chunk_rows)
        assert message.startswith("line 8: value 3 ('inf') is not a finite float32")


def _record(token: bytes, values: list[float]) -> bytes:
    return token + b" " + np.array(values, dtype="<f4").tobytes() + b"\n"


BIN = b"3 2\n" + _record(b"a", [1, 2])
BAD_BINARY = [
    (BIN + b"b " + b"\0" * 5, "record 2: truncated: token 'b' has 5 of its 8 value bytes"),
    (BIN + b"bc", "record 2: truncated: the file ends inside the token 'bc'"),
    (BIN + b" " + b"\0" * 8, "record 2: empty token"),
    (BIN + _record(b"b", [1, np.nan]), "record 2: value 2 is nan, not finite"),
    (BIN + _record(b"b", [1, 2]) + _record(b"c", [np.inf, 2]), "record 3: value 1 is inf"),
    (BIN + _record(b"\xe4", [1, 2]), "record 2: token '\ufffd' is not valid utf-8"),
    (BIN + b"x" * 70000, "record 2: no space in 65536 bytes after 'xxx"),
    (b"3 two\n", "header (record 0): expected a header '<rows> <dim>' (two integers)"),
    (b"\x00\x01\x02", "header (record 0): expected a header '<rows> <dim>' (two integers)"),
]


@pytest.mark.parametrize("content,expected", BAD_BINARY)
def test_malformed_binary_names_file_record_and_fault(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    for chunk_rows in (1, 65536):
        message = corrupt(tmp_path, content, "word2vec-binary", chunk_rows=chunk_rows)
        assert message.startswith(expected), message


# -- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"format": "gloves"}, "format must be one of"),
        ({"chunk_rows": 0}, "chunk_rows must be an int >= 1"),
        ({"chunk_rows": 2.0}, "chunk_rows must be an int >= 1"),
        ({"encoding": "no-such-codec"}, "unknown codec"),
        ({"encoding": "utf-16"}, "ASCII-compatible"),
    ],
)
def test_bad_read_arguments(tmp_path: Path, kw: dict[str, object], match: str) -> None:
    path = tmp_path / "v.txt"
    path.write_bytes(b"1 1\na 1\n")
    args: dict[str, object] = {"format": "word2vec"}
    args.update(kw)
    with pytest.raises(InvalidArgumentError, match=match):
        read_vectors(path, **args)  # type: ignore[arg-type]


ONE = np.ones((1, 2), np.float32)
BAD_WRITES = [
    ("word2vec", [(["a b"], ONE)], 1, "token 'a b' contains whitespace"),
    ("word2vec-binary", [(["a\tb"], ONE)], 1, "contains whitespace"),
    ("fasttext", [([""], ONE)], 1, "token '' is empty"),
    ("glove", [(["a b"], ONE)], 1, "the first GloVe token"),
    ("glove", [(["a", "b "], np.ones((2, 2)))], 2, "starts or ends with whitespace"),
    ("glove", [(["a", "b\nc"], np.ones((2, 2)))], 2, "contains a line break"),
    ("word2vec", [(["a"], np.ones((1, 3)))], 1, "values must be (1, 2)"),
    ("word2vec", [(["a", "b"], ONE)], 2, "values must be (2, 2)"),
    ("word2vec", [(["a"], np.array([[1.0, np.nan]]))], 1, "value 2 is nan"),
    ("word2vec", [(["a"], np.array([[1e39, 1.0]]))], 1, "not a finite float32"),
    ("word2vec", [(["a"], np.array([["1", "2"]]))], 1, "values must be numbers"),
    ("word2vec", [([1], ONE)], 1, "is a int, not a str"),
    ("word2vec", [(["\ud800"], ONE)], 1, "is not encodable in UTF-8"),
    ("word2vec", [(["a"], ONE)], 2, "rows=2 but the chunks held 1 rows"),
    ("word2vec", [], -1, "rows must be an int >= 0"),
    ("vec", [], 0, "format must be one of"),
]


@pytest.mark.parametrize("fmt,chunks,rows,match", BAD_WRITES)
def test_bad_writes(tmp_path: Path, fmt: str, chunks: list, rows: int, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidArgumentError) as e:
        write_vectors(tmp_path / "out", fmt, chunks, rows=rows, dim=2)
    assert match in str(e.value)


def test_write_needs_a_positive_dim(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="dim must be an int >= 1"):
        write_vectors(tmp_path / "out", "glove", [], rows=0, dim=0)


def test_write_refuses_a_glove_line_1_that_reads_as_a_header(tmp_path: Path) -> None:
    three = np.array([[3.0]], np.float32)
    with pytest.raises(InvalidArgumentError, match="would read as a word2vec header"):
        write_vectors(tmp_path / "g", "glove", [(["7"], three)], rows=1, dim=1)
    write_vectors(tmp_path / "g", "glove", [(["7"], -three)], rows=1, dim=1)
    assert read_all(tmp_path / "g", "glove")[1] == ["7"]
