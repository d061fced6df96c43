"""The options evdb opens its RocksDB with: compression per column family and the memory budget.

One function builds them (``rocks_options``), so the store, its recovery and the benchmarks
that compare evdb with a bare rocksdict database all open RocksDB the same way.
"""

from __future__ import annotations

from typing import Any, Literal

import rocksdict

__all__ = [
    "BLOCK_CACHE_BYTES",
    "WRITE_BUFFER_BYTES",
    "WRITE_CHUNK",
    "Compression",
    "family_options",
    "read_options",
    "rocks_options",
]

Compression = Literal["lz4", "zstd", "none"]

WRITE_CHUNK = 65536  # rows per write batch: bounds the batch's memory
# Big puts stay on write batches, not SST files that RocksDB ingests: ingestion made db.flush()
# of 1M sorted rows 1.2 -> 1.0 s, but rocksdict's SstFileWriter drops its files from the OS page
# cache, so the next checkpoint's digests and any scan read them back from disk (a checkpoint
# of 5M rows after their flush: 0.22 -> 4.9 s; Table.neighbors over rows on disk 480-590K/s ->
# 400-425K/s).
_COMPRESSION = {
    "lz4": rocksdict.DBCompressionType.lz4,
    "zstd": rocksdict.DBCompressionType.zstd,
    "none": rocksdict.DBCompressionType.none,
}


# Memory RocksDB may use, whatever the table size: the shared block cache plus, per column
# family, at most two memtables (the budget README's "Memory" section states).
BLOCK_CACHE_BYTES = 32 << 20
WRITE_BUFFER_BYTES = 16 << 20


def rocks_options(
    compression: Compression = "lz4", cache: Any = None, mmap_reads: bool = False
) -> rocksdict.Options:
    """The options of one column family (and, for the default one, of the database itself).

    Parameters
    ----------
    compression
        The family's block compression.
    cache
        The ``rocksdict.Cache`` its table files' blocks share, or None for none.
    mmap_reads
        Read files through memory maps: a database-wide option, read from the options of the
        default family, which the database is opened with.
    """
    opts = rocksdict.Options(raw_mode=True)
    # a database-wide option, read from the options the database itself is opened with
    opts.set_allow_mmap_reads(mmap_reads)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_compression_type(_COMPRESSION[compression]())
    opts.set_write_buffer_size(WRITE_BUFFER_BYTES)
    opts.set_max_write_buffer_number(2)
    opts.set_max_background_jobs(2)
    # Eight L0 files (RocksDB's default: 4) before they are merged into the levels below: each
    # merge then carries twice the rows over the same lower-level files, so a table that
    # spills rewrites less. bench_tiers' spilling run (1,000 steps after 500): compaction
    # writes 4.1 -> 2.7 GB and takes 10.3 -> 6.2 s of background time, which on 2 cores it
    # took from the training step (12.4 -> 10.7-11.6 ms a step); the reads of DRAM misses
    # probe more L0 files' bloom filters and still came out 5.0 -> 4.6-4.9 ms a step. 12
    # files gained nothing more; writes slow down only from 20 (RocksDB's default).
    opts.set_level_zero_file_num_compaction_trigger(8)
    table = rocksdict.BlockBasedOptions()
    table.set_bloom_filter(10, False)  # a miss (a key never spilled) costs no disk read
    if cache is not None:
        table.set_block_cache(cache)
    opts.set_block_based_table_factory(table)
    return opts


def family_options(
    column_families: dict[str, Compression], cache: Any
) -> dict[str, rocksdict.Options]:
    """The options of each column family of ``column_families`` (name -> compression), over
    one shared block cache."""
    return {name: rocks_options(c, cache) for name, c in column_families.items()}


def read_options() -> rocksdict.ReadOptions:
    """The options of the RocksDB tier's multi-gets. Block checksums stay verified (RocksDB
    checks a block as it reads it from a file, not on a block-cache hit): FBGEMM turns them
    off, but a block damaged on disk would then be served as rows, silently, and no measured
    gain here was worth that (bench/README, "profile_spill")."""
    opts = rocksdict.ReadOptions()
    opts.set_verify_checksums(True)
    return opts
