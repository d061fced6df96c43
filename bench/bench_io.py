"""Exports, imports and checkpoints, as ratios against baselines measured in the same run.

What is measured (dim ``--dim``, float32 values; every file and store is a fresh directory
under ``--tmpdir``, so that file system is the disk measured; ``os.sync()`` runs before every
timed call, so no call pays for the dirty pages of the one before):

* export, int keys: a table of ``--rows`` rows (int64 keys, SGD so a record has no slots,
  ``dram_rows=None`` so every row is in DRAM, ``disk=True``), filled with ``upsert`` in chunks
  of 65,536 and ``db.flush()`` (both timed: the build). ``evdb``: ``evdb.export(db, dest,
  format=...)`` from the open database, for npz (float32 and float16), safetensors, parquet and
  serving: the table scan, the file writer, then xxh3-128 of every file and fsyncs
  (``MANIFEST.json``). ``limit``: ``np.save`` of the same keys (n,) int64 and values (n, dim)
  arrays (float16 values for the float16 export, converted before the clock starts) to two
  ``.npy`` files in the same directory, each fsynced: the bytes to write, with nothing to scan
  or convert. The limit is the fastest of its runs: ``--repeat`` before the exports and
  ``--repeat`` after them.
* export, words: a ``key_type="str", keep_strings=True`` table of ``--word-rows`` rows (tokens
  ``w0, w1, ...``; text is slow), built the same way, exported to word2vec text and binary.
  ``writer``: ``evdb.io.vectors.write_vectors`` alone writing the same tokens and values (in
  memory, chunks of 65,536, as the export streams them), then an fsync: the file format's own
  cost, without evdb's table scan, string lookups and checksums. ``np.save``: the tokens (a
  fixed-width str array) and values, fsynced, for scale.
* import: ``evdb.import_vectors(db, table, src, format)`` into a fresh database (the table is
  created, ``dram_rows=None``), of the npz the int-key export wrote (``--rows`` rows) and of
  word2vec text, word2vec binary and GloVe files of ``--word-rows`` rows (written beforehand by
  ``write_vectors``). ``import_vectors`` reads its file twice by design (a pass that checks
  every line and counts the rows, then a pass that upserts), so it cannot beat 2x its reader.
  ``reader``: for npz, ``np.load`` of the file with ``keys`` and ``values`` read in full (the
  limit); for word files ``evdb.io.vectors.read_vectors`` consumed to the end (the parse cost).
  ``writing s`` = import - 2 x reader: what putting the rows into the table costs. The
  ``db.flush()`` after the import (which makes the rows durable) is shown apart.
* checkpoints: a table of ``--ckpt-rows`` rows (int64 keys; ``--ckpt-optimizer``, default
  Adagrad, so each record also carries dim float32 accumulators), ``dram_rows=None``, built as
  above. ``db.checkpoint(c1)`` (full), then ``upsert`` of new values for ``--changed`` of the
  rows (1%) and a ``db.flush()`` (timed apart, so the checkpoints after it do not pay for the
  changed rows' write-back; each still runs its own flush, with nothing dirty), then
  ``db.checkpoint(c2, base=c1)`` (incremental) and ``db.checkpoint(c3)`` (full). For each:
  seconds, the bytes its ``MANIFEST.json`` lists (the sum of its files' sizes), and the bytes
  new on disk: the files with ``st_nlink == 1`` right after it is taken (a full checkpoint
  hard-links the SST files of the database's last flush, so they cost no new space while the
  database keeps them). Then the database is closed and ``evdb.open(workdir, restore=...)``
  (verify every checksum, rebuild, flush; the checkpoint itself is never written) is timed
  from c2 (the rebuild applies the delta to c1's rows) and from c3 (SST files hard-linked, as
  evdb's own working copies are). Both restored databases are checked: the row count, and the
  changed rows read back with their new values.

Each export and import figure is the median of ``--repeat`` timed calls (default 1: each call
moves gigabytes at the default sizes), with ``time.perf_counter``; no warm-up call (the files
are in the page cache only as much as the machine leaves them). Nothing is asserted about
times. Run: ``.venv/bin/python bench/bench_io.py`` or ``--quick``.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numba
import numpy as np
from _common import (
    cpu_line,
    fill,
    fmt_count,
    fmt_rate,
    fmt_ratio,
    fs_of,
    log,
    malloc_trim,
    print_table,
    random_keys,
    timed,
    values_like_trained,
    versions_line,
    wall_line,
)

import evdb
from evdb.checkpoint import read_manifest
from evdb.io.vectors import read_vectors, write_vectors

TABLE = "bench"
WORDS = "words"
CHUNK = 65_536  # rows per upsert while building, and export's and import's chunk_rows
ADAGRAD_LR = 0.05
INT_EXPORTS = (  # (label, format, dtype)
    ("npz", "npz", "float32"),
    ("npz float16", "npz", "float16"),
    ("safetensors", "safetensors", "float32"),
    ("parquet", "parquet", "float32"),
    ("serving", "serving", "float32"),
)
WORD_EXPORTS = ("word2vec", "word2vec-binary")
WORD_IMPORTS = ("word2vec", "word2vec-binary", "glove")
HAS_PYARROW = importlib.util.find_spec("pyarrow") is not None


# -- results ------------------------------------------------------------------------------
@dataclass
class ExportResult:
    label: str
    dtype: str
    rows: int
    evdb: float  # median s
    bytes: int  # the export's files, as its MANIFEST.json lists them
    limit: float  # s of the baseline (np.save, or write_vectors for word files)
    limit_name: str
    save: float | None = None  # words: s of np.save of the same data, for scale


@dataclass
class ImportResult:
    label: str
    rows: int
    evdb: float  # median s of import_vectors
    reader: float  # median s of the reader alone (np.load, read_vectors)
    reader_name: str
    flush: float  # s of the db.flush() after the (last) import
    file_bytes: int


@dataclass
class CheckpointResult:
    label: str
    seconds: float
    files: int
    listed: int  # bytes, from MANIFEST.json
    new: int  # bytes of files with st_nlink == 1 (not shared with the database's files)
    changed_rows: int | None = None


@dataclass
class Report:
    build: dict[str, float] = field(default_factory=dict)
    exports: list[ExportResult] = field(default_factory=list)
    word_exports: list[ExportResult] = field(default_factory=list)
    imports: list[ImportResult] = field(default_factory=list)
    checkpoints: list[CheckpointResult] = field(default_factory=list)
    ckpt_times: dict[str, float] = field(default_factory=dict)
    opens: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # failed correctness checks


# -- helpers ------------------------------------------------------------------------------
def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def files_under(path: Path) -> Iterator[Path]:
    for root, _, files in os.walk(path):
        for name in files:
            yield Path(root) / name


def fmt_bytes(n: float) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB"


def fmt_s(s: float) -> str:
    return f"{s:.2f}" if s < 100 else f"{s:.0f}"


def load_line() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min)"


def median_time(repeat: int, fn: Callable[[int], float]) -> float:
    """The median of fn(i) over repeat calls; fn returns the seconds of its timed part."""
    return statistics.median(fn(i) for i in range(repeat))


def save_arrays(where: Path, arrays: dict[str, np.ndarray]) -> float:
    """Seconds to np.save each array to where/<name>.npy and fsync it (and the directory);
    the files are removed afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    os.sync()
    t0 = time.perf_counter()
    for name, a in arrays.items():
        with (where / f"{name}.npy").open("wb") as f:
            np.save(f, a)
            f.flush()
            os.fsync(f.fileno())
    fsync_path(where)
    seconds = time.perf_counter() - t0
    shutil.rmtree(where)
    return seconds


def timed_export(
    db: evdb.Database, dest: Path, table: str, fmt: str, dtype: str, keep: bool = False
) -> tuple[float, int, int]:
    """(s, bytes, rows) of one export of table to dest (removed afterwards unless keep)."""
    os.sync()
    t0 = time.perf_counter()
    manifest = evdb.export(db, dest, tables=[table], format=fmt, dtype=dtype, chunk_rows=CHUNK)
    seconds = time.perf_counter() - t0
    size = sum(f["size"] for f in manifest["files"].values())
    rows = manifest["tables"][table]["rows"]
    if not keep:
        shutil.rmtree(dest)
    return seconds, size, rows


def chunked(tokens: list[str], values: np.ndarray) -> Iterator[tuple[list[str], np.ndarray]]:
    for start in range(0, len(tokens), CHUNK):
        yield tokens[start : start + CHUNK], values[start : start + CHUNK]


def write_vector_file(path: Path, fmt: str, tokens: list[str], values: np.ndarray) -> float:
    """Seconds to write tokens and values with write_vectors and fsync the file."""
    os.sync()
    t0 = time.perf_counter()
    write_vectors(path, fmt, chunked(tokens, values), rows=len(tokens), dim=values.shape[1])
    fsync_path(path)
    return time.perf_counter() - t0


def read_all(path: Path, fmt: str) -> int:
    """Rows of a vector file, every chunk parsed (read_vectors consumed to the end)."""
    _, chunks = read_vectors(path, fmt, chunk_rows=CHUNK)
    return sum(c.values.shape[0] for c in chunks)


def load_npz(path: Path) -> int:
    """Rows of an npz, its keys and values read in full."""
    with np.load(path, allow_pickle=False) as z:
        keys, values = z["keys"], z["values"]
    if values.shape[0] != keys.shape[0]:
        raise SystemExit(f"{path}: keys and values do not line up")
    return int(keys.shape[0])


def timed_import(
    root: Path, name: str, table: str, src: Path, fmt: str, expect: int
) -> tuple[float, float]:
    """(s of import_vectors, s of the db.flush() after it) into a fresh database."""
    path = root / name
    db = evdb.open(path)
    try:
        os.sync()
        t0 = time.perf_counter()
        result = evdb.import_vectors(db, table, src, fmt, chunk_rows=CHUNK)
        seconds = time.perf_counter() - t0
        if result["rows"] != expect:
            raise SystemExit(f"import of {src} gave {result['rows']} rows, expected {expect}")
        flush_s = timed(db.flush)
        db.drop_table(table)  # close() then has no rows to write
    finally:
        db.close()
    shutil.rmtree(path)
    return seconds, flush_s


def checkpoint_sizes(path: Path) -> tuple[int, int, int]:
    """(files, bytes its MANIFEST.json lists, bytes of files with st_nlink == 1)."""
    manifest = read_manifest(path)
    assert manifest is not None
    listed = sum(f["size"] for f in manifest["files"].values())
    new = 0
    for p in files_under(path):
        st = p.stat()
        if st.st_nlink == 1:
            new += st.st_size
    return len(manifest["files"]), listed, new


# -- 1. export and 2. import --------------------------------------------------------------
def bench_int(args: argparse.Namespace, root: Path, report: Report) -> None:
    """Exports of the int-key table against np.save; then the npz import against np.load."""
    rng = np.random.default_rng(args.seed)
    n, dim = args.rows, args.dim
    keys = random_keys(rng, n)
    values = values_like_trained(rng, n, dim)
    db_path = root / "export-db"
    db = evdb.open(db_path)
    npz_dir = root / "export-npz"
    try:
        t = db.create_table(TABLE, dim=dim, dram_rows=None, disk=True)
        report.build["upsert"] = timed(lambda: fill(t, keys, values))
        report.build["flush"] = timed(db.flush)
        if len(t) != n:  # 2^-64 odds per pair, but a duplicate would skew the figures
            raise SystemExit(f"random keys collided: {len(t)} rows for {n}; rerun --seed")
        log(f"  built {fmt_count(n)} rows: {report.build['upsert'] + report.build['flush']:.0f}s")

        limits: dict[str, list[float]] = {"float32": [], "float16": []}
        arrays = {"float32": values, "float16": values.astype(np.float16)}

        def baselines() -> None:
            for _ in range(args.repeat):
                for dtype, v in arrays.items():
                    limits[dtype].append(save_arrays(root / "np", {"k": keys, "v": v}))

        baselines()
        exported: list[tuple[str, str, float, int]] = []
        for label, fmt, dtype in INT_EXPORTS:
            if fmt == "parquet" and not HAS_PYARROW:
                log("  parquet: skipped (no pyarrow)")
                continue
            sizes: list[int] = []

            def one(i: int, fmt: str = fmt, dtype: str = dtype, sizes: list[int] = sizes) -> float:
                # the first float32 npz is kept, as the import's input
                keep = (fmt, dtype) == ("npz", "float32") and i == 0
                dest = npz_dir if keep else root / "export"
                s, size, rows = timed_export(db, dest, TABLE, fmt, dtype, keep=keep)
                if rows != n:
                    raise SystemExit(f"{fmt} {dtype} export wrote {rows} rows, expected {n}")
                sizes.append(size)
                return s

            s = median_time(args.repeat, one)
            exported.append((label, dtype, s, sizes[0]))
            log(f"  export {label}: {s:.1f}s")
        baselines()
        arrays.clear()
        for label, dtype, s, size in exported:
            report.exports.append(
                ExportResult(label, dtype, n, s, size, min(limits[dtype]), f"np.save {dtype}")
            )
        db.drop_table(TABLE)
    finally:
        db.close()
    shutil.rmtree(db_path)
    gc.collect()
    malloc_trim()

    # 2. import of the npz the export wrote
    src = npz_dir / f"{TABLE}.npz"
    size = src.stat().st_size
    reader = median_time(args.repeat, lambda _: timed(lambda: load_npz(src)))
    runs = [timed_import(root, "import-npz", TABLE, src, "npz", n) for _ in range(args.repeat)]
    report.imports.append(
        ImportResult(
            "npz (int64 keys)",
            n,
            statistics.median(r[0] for r in runs),
            reader,
            "np.load",
            runs[-1][1],
            size,
        )
    )
    log(f"  import npz: {report.imports[-1].evdb:.1f}s")
    shutil.rmtree(npz_dir)


def bench_words(args: argparse.Namespace, root: Path, report: Report) -> None:
    """word2vec exports against write_vectors alone; word imports against read_vectors."""
    rng = np.random.default_rng(args.seed + 1)
    n, dim = args.word_rows, args.dim
    tokens = [f"w{i}" for i in range(n)]
    values = values_like_trained(rng, n, dim)
    db_path = root / "words-db"
    db = evdb.open(db_path)
    try:
        t = db.create_table(WORDS, dim=dim, key_type="str", keep_strings=True, dram_rows=None)
        report.build["word upsert"] = timed(lambda: fill(t, tokens, values))
        report.build["word flush"] = timed(db.flush)
        if len(t) != n:
            raise SystemExit(f"{len(t)} rows in the words table, expected {n}")
        token_array = np.array(tokens)
        saves = [
            save_arrays(root / "np", {"k": token_array, "v": values}) for _ in range(args.repeat)
        ]
        for fmt in WORD_EXPORTS:
            sizes: list[int] = []

            def one(_: int, fmt: str = fmt, sizes: list[int] = sizes) -> float:
                s, size, rows = timed_export(db, root / "export", WORDS, fmt, "float32")
                if rows != n:
                    raise SystemExit(f"{fmt} export wrote {rows} rows, expected {n}")
                sizes.append(size)
                return s

            def writer(_: int, fmt: str = fmt) -> float:
                path = root / f"writer.{fmt}"
                s = write_vector_file(path, fmt, tokens, values)
                path.unlink()
                return s

            s = median_time(args.repeat, one)
            w = median_time(args.repeat, writer)
            report.word_exports.append(
                ExportResult(fmt, "float32", n, s, sizes[0], w, "write_vectors", min(saves))
            )
            log(f"  export {fmt}: {s:.1f}s, write_vectors {w:.1f}s")
        db.drop_table(WORDS)
    finally:
        db.close()
    shutil.rmtree(db_path)

    for fmt in WORD_IMPORTS:
        src = root / f"input.{fmt}"
        write_vectors(src, fmt, chunked(tokens, values), rows=n, dim=dim)  # untimed
        counted = read_all(src, fmt)
        if counted != n:
            raise SystemExit(f"read_vectors read {counted} rows of {src}, expected {n}")

        def read(_: int, src: Path = src, fmt: str = fmt) -> float:
            return timed(lambda: read_all(src, fmt))

        reader = median_time(args.repeat, read)
        runs = [timed_import(root, "import-words", WORDS, src, fmt, n) for _ in range(args.repeat)]
        report.imports.append(
            ImportResult(
                fmt,
                n,
                statistics.median(r[0] for r in runs),
                reader,
                "read_vectors",
                runs[-1][1],
                src.stat().st_size,
            )
        )
        log(f"  import {fmt}: {report.imports[-1].evdb:.1f}s, read_vectors {reader:.1f}s")
        src.unlink()


# -- 3. checkpoints -----------------------------------------------------------------------
def bench_checkpoint(args: argparse.Namespace, root: Path, report: Report) -> None:
    rng = np.random.default_rng(args.seed + 2)
    n, dim = args.ckpt_rows, args.dim
    optimizer = evdb.optim.Adagrad(lr=ADAGRAD_LR) if args.ckpt_optimizer == "adagrad" else None
    keys = random_keys(rng, n)
    db_path = root / "ckpt-db"
    c1, c2, c3 = root / "c1-full", root / "c2-incremental", root / "c3-full"
    times = report.ckpt_times
    db = evdb.open(db_path)
    try:
        t = db.create_table(TABLE, dim=dim, optimizer=optimizer, dram_rows=None, disk=True)

        def build() -> None:
            for start in range(0, n, CHUNK):
                chunk = keys[start : start + CHUNK]
                t.upsert(chunk, values_like_trained(rng, chunk.shape[0], dim))

        times["upsert"] = timed(build)
        times["flush"] = timed(db.flush)
        if len(t) != n:
            raise SystemExit(f"random keys collided: {len(t)} rows for {n}; rerun --seed")
        log(f"  built {fmt_count(n)} rows: {times['upsert'] + times['flush']:.0f}s")

        def take(label: str, dest: Path, base: Path | None = None) -> None:
            os.sync()
            t0 = time.perf_counter()
            manifest = db.checkpoint(dest, base=base)
            seconds = time.perf_counter() - t0
            files, listed, new = checkpoint_sizes(dest)
            changed = manifest.get("changed_rows", {}).get(TABLE)
            report.checkpoints.append(CheckpointResult(label, seconds, files, listed, new, changed))
            log(f"  {label}: {seconds:.2f}s")

        take("full (c1)", c1)
        m = max(1, round(args.changed * n))
        changed = np.sort(rng.choice(n, m, replace=False))
        new_values = values_like_trained(rng, m, dim) + 1.0
        times["change"] = timed(lambda: fill(t, keys[changed], new_values))
        times["change flush"] = timed(db.flush)
        take("incremental (c2, base c1)", c2, c1)
        take("full (c3)", c3)
        db.drop_table(TABLE)  # the checkpoints hold the rows; close() has none to write
    finally:
        db.close()
    gc.collect()
    malloc_trim()

    probe = rng.choice(m, min(m, 1000), replace=False)
    for label, src in (("incremental", c2), ("full", c3)):
        copy = root / f"open-{label}"
        os.sync()
        t0 = time.perf_counter()
        opened = evdb.open(copy, restore=src)  # a checkpoint is never opened for writing
        report.opens[label] = time.perf_counter() - t0
        try:
            t = opened.table(TABLE)
            if len(t) != n:
                report.problems.append(f"restore from {label}: {len(t)} rows, expected {n}")
            got = t.lookup(keys[changed[probe]])
            if not np.array_equal(got, new_values[probe]):
                report.problems.append(
                    f"restore from {label}: the changed rows do not read back their new values"
                )
        finally:
            opened.close()
        log(f"  restore from {label}: {report.opens[label]:.2f}s")
        shutil.rmtree(copy)
    for path in (c1, c2, c3, db_path):
        shutil.rmtree(path)


# -- output -------------------------------------------------------------------------------
def print_header(args: argparse.Namespace, store: str) -> None:
    extras = []
    for name in ("pyarrow", "safetensors"):
        try:
            extras.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            extras.append(f"{name} absent")
    optimizer = (
        "Adagrad, record has dim accumulators" if args.ckpt_optimizer == "adagrad" else "SGD"
    )
    lines = [
        "evdb export / import / checkpoint benchmark (bench/bench_io.py)",
        cpu_line(),
        f"threads     numba {numba.get_num_threads()}",
        versions_line("not used") + f"; {', '.join(extras)}",
        f"store       {store} ({fs_of(store)}); os.sync() before every timed call",
        f"load        {load_line()} at the start",
        f"export      {fmt_count(args.rows)} rows, dim {args.dim}, int64 keys, float32, SGD, all "
        f"in DRAM (flushed); words: {fmt_count(args.word_rows)} rows, key_type='str', "
        "keep_strings=True",
        f"import      npz of {fmt_count(args.rows)} rows; word2vec, word2vec-binary, glove of "
        f"{fmt_count(args.word_rows)} rows; into fresh databases, chunk_rows {fmt_count(CHUNK)}",
        f"checkpoint  {fmt_count(args.ckpt_rows)} rows, dim {args.dim}, {optimizer}; "
        f"{args.changed:.0%} of the rows changed between c1 and c2",
        f"timing      median of {args.repeat} call(s), no warm-up; np.save limits: the faster "
        "of the runs before and after the exports",
        "units       rows/s (M = 1e6, K = 1e3); ratios are evdb / baseline in rows/s (above 1x: "
        "evdb faster)",
    ]
    print("\n".join(lines))


def print_report(report: Report, args: argparse.Namespace) -> None:
    b = report.build
    print(
        f"\n1. export of {fmt_count(args.rows)} rows (int64 keys, dim {args.dim}, SGD, every "
        "row in DRAM)"
    )
    print(
        f"(build: upsert {b['upsert']:.1f}s ({fmt_rate(args.rows / b['upsert'], 2)}), "
        f"db.flush() {b['flush']:.1f}s ({fmt_rate(args.rows / b['flush'], 2)}))"
    )
    rows = []
    for e in report.exports:
        rows.append(
            [
                e.label,
                fmt_bytes(e.bytes),
                fmt_s(e.evdb),
                fmt_rate(e.rows / e.evdb, 2),
                e.limit_name,
                fmt_rate(e.rows / e.limit, 2),
                fmt_ratio(e.limit / e.evdb),
            ]
        )
    header = ["format", "bytes", "evdb s", "evdb rows/s", "limit", "limit rows/s", "evdb/limit"]
    print_table(header, rows, first_left=1)
    print(
        "(evdb: scan + write + xxh3-128 of every file + fsyncs; limit: np.save of the keys and\n"
        " values arrays to two .npy files, fsynced; serving writes a RocksDB database of the rows)"
    )

    print(
        f"\n   words: {fmt_count(args.word_rows)} rows (key_type='str', keep_strings=True, "
        f"dim {args.dim})"
    )
    print(
        f"(build: upsert {b['word upsert']:.1f}s "
        f"({fmt_rate(args.word_rows / b['word upsert'], 2)}), db.flush() "
        f"{b['word flush']:.1f}s ({fmt_rate(args.word_rows / b['word flush'], 2)}))"
    )
    rows = []
    for e in report.word_exports:
        assert e.save is not None
        rows.append(
            [
                e.label,
                fmt_bytes(e.bytes),
                fmt_s(e.evdb),
                fmt_rate(e.rows / e.evdb, 2),
                fmt_rate(e.rows / e.limit, 2),
                fmt_ratio(e.limit / e.evdb),
                fmt_rate(e.rows / e.save, 2),
                fmt_ratio(e.save / e.evdb),
            ]
        )
    header = [
        "format",
        "bytes",
        "evdb s",
        "evdb rows/s",
        "write_vectors",
        "evdb/writer",
        "np.save",
        "evdb/np.save",
    ]
    print_table(header, rows, first_left=1)
    print(
        "(write_vectors: the same tokens and values from memory, fsynced; np.save: tokens as a\n"
        " str array + values, fsynced, for scale)"
    )

    print("\n2. import into a fresh table (import_vectors reads its file twice, by design:")
    print("   a pass that checks every line and counts the rows, then a pass that upserts)")
    rows = []
    for r in report.imports:
        rows.append(
            [
                r.label,
                fmt_count(r.rows),
                fmt_bytes(r.file_bytes),
                fmt_s(r.evdb),
                fmt_rate(r.rows / r.evdb, 2),
                r.reader_name,
                fmt_s(r.reader),
                fmt_rate(r.rows / r.reader, 2),
                fmt_ratio(r.reader / r.evdb),
                fmt_s(r.evdb - 2 * r.reader),
                fmt_s(r.flush),
            ]
        )
    header = [
        "format",
        "rows",
        "file",
        "import s",
        "import rows/s",
        "reader",
        "reader s",
        "reader rows/s",
        "evdb/reader",
        "writing s",
        "flush s",
    ]
    print_table(header, rows, first_left=1)
    print(
        "(the two reads hold evdb/reader to about 0.50x at best; writing s = import s - 2 x\n"
        " reader s: the cost of putting the rows into the table; flush s: the db.flush() after\n"
        " the import, not in import s; np.load reads the arrays in full, the limit for npz)"
    )

    c = report.ckpt_times
    n = args.ckpt_rows
    print(
        f"\n3. checkpoints of {fmt_count(n)} rows ({args.ckpt_optimizer}), "
        f"{args.changed:.0%} of them changed between c1 and c2"
    )
    print(
        f"(build: upsert {c['upsert']:.1f}s, db.flush() {c['flush']:.1f}s; change: upsert "
        f"{c['change']:.2f}s, db.flush() {c['change flush']:.2f}s, before c2)"
    )
    full = next((k for k in report.checkpoints if k.label.startswith("full (c3")), None)
    rows = []
    for k in report.checkpoints:
        rows.append(
            [
                k.label,
                fmt_s(k.seconds),
                fmt_count(k.files),
                fmt_bytes(k.listed),
                fmt_bytes(k.new),
                "-" if k.changed_rows is None else fmt_count(k.changed_rows),
                fmt_ratio(k.seconds / full.seconds) if full else "-",
                fmt_ratio(k.listed / full.listed) if full else "-",
            ]
        )
    header = [
        "checkpoint",
        "s",
        "files",
        "bytes",
        "new bytes",
        "rows in delta",
        "s vs c3",
        "bytes vs c3",
    ]
    print_table(header, rows, first_left=1)
    print(
        "(bytes: the files MANIFEST.json lists; new bytes: files with st_nlink == 1 right after\n"
        " the checkpoint: a full one hard-links the SST files of the database's last flush,\n"
        " which cost no new space while the database keeps them; each checkpoint runs a flush\n"
        " first, with nothing dirty here)"
    )
    o = report.opens
    if "incremental" in o and "full" in o:
        rows = [
            [
                "restore=c2 (incremental)",
                fmt_s(o["incremental"]),
                fmt_ratio(o["incremental"] / o["full"]),
            ],
            ["restore=c3 (full)", fmt_s(o["full"]), "1.00x"],
        ]
        print_table(["evdb.open(workdir, ...)", "s", "vs full"], rows, first_left=1)
        print(
            "(verify every checksum (c2: and c1's), rebuild (c2: c1's rows, then the delta's\n"
            " deletions and rows), flush; SST files of the checkpoint hard-linked)"
        )
    for problem in report.problems:
        print(f"CHECK FAILED: {problem}")
    if not report.problems:
        print("check: both restored databases hold every row, and the changed rows' new values")


# -- main ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=5_000_000, help="int-key export/import rows")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--word-rows", type=int, default=500_000, help="word-file rows")
    p.add_argument("--ckpt-rows", type=int, default=None, help="checkpoint rows (default --rows)")
    p.add_argument("--ckpt-optimizer", choices=("adagrad", "sgd"), default="adagrad")
    p.add_argument("--changed", type=float, default=0.01, help="share of rows changed after c1")
    p.add_argument("--repeat", type=int, default=1, help="timed calls per figure (median)")
    p.add_argument("--tmpdir", default=None, help="where the files live (the disk measured)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="smoke run: small sizes, seconds")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.word_rows = 100_000, 20_000
        args.ckpt_rows = args.ckpt_rows or 100_000
    if args.ckpt_rows is None:
        args.ckpt_rows = args.rows
    if min(args.rows, args.word_rows, args.ckpt_rows, args.repeat, args.dim) < 1:
        p.error("sizes, --dim and --repeat must be at least 1")
    if not 0 < args.changed <= 1:
        p.error("--changed must be in (0, 1]")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    store = args.tmpdir or tempfile.gettempdir()
    print_header(args, store)
    sys.stdout.flush()
    report = Report()
    root = Path(tempfile.mkdtemp(prefix="evdb-bench-io-", dir=args.tmpdir))
    try:
        for name, fn in (
            ("export and npz import", bench_int),
            ("words: export and import", bench_words),
            ("checkpoints", bench_checkpoint),
        ):
            log(f"[{name}]")
            t0 = time.perf_counter()
            fn(args, root, report)
            gc.collect()
            malloc_trim()
            log(f"  {time.perf_counter() - t0:.0f}s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_report(report, args)
    print(f"\nload {load_line()} at the end")
    print(wall_line())
    if report.problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
