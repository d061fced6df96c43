"""RocksDB option sets named by flags, for measuring them under evdb (issue 32).

A configuration is a comma-separated set of flags applied on top of evdb's own options
(``evdb.tiers.store_options``); the empty configuration is evdb's options as they are.
``probe_rocks_options`` applies them to a bare database, ``profile_spill --configs`` to
evdb's store itself (by wrapping ``store_options.rocks_options`` and ``read_options`` for
the duration of a run), so each option is measured under the load that decides it.

Flags:

=============  ===========================================================================
``wbN``        memtables of N MiB (``write_buffer_size``)
``nbufN``      at most N memtables (``max_write_buffer_number``)
``mergeN``     N immutable memtables merged into one flush (``min_write_buffer_number_to_merge``)
``univ``       universal compaction (level otherwise)
``l0_N``       level-0 compaction trigger N
``jobsN``      N background jobs
``lbaseN``     ``max_bytes_for_level_base`` of N MiB
``tfileN``     ``target_file_size_base`` of N MiB
``bsN``        N KiB data blocks (4 otherwise)
``dbhash``     the data-block hash index
``bloomN``     N bits a key in the Bloom filter (``bloom0``: no filter)
``hits``       ``optimize_filters_for_hits`` (no filter in the last level)
``cacheN``     a block cache of N MiB
``hcc``        a HyperClockCache instead of the LRU block cache
``rowN``       a row cache of N MiB
``pin``        index and filter blocks in the block cache, level 0's pinned
``nover``      reads without block checksum verification
``nofill``     multi-gets do not insert the blocks they read into the block cache
``mmap``       memory-mapped reads
``nosplit``    the RocksDB tier's multi-gets are never split between two threads
``mtbloom``    a Bloom filter on every memtable (whole keys, 10% of its size): a read of a
               key the memtable lacks skips its skip-list search
=============  ===========================================================================
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import rocksdict

from evdb.tiers import rocks, store, store_options

FLAGS = re.compile(
    r"^(wb\d+|nbuf\d+|merge\d+|univ|l0_\d+|jobs\d+|lbase\d+|tfile\d+|bs\d+|dbhash|bloom\d+"
    r"|hits|cache\d+|hcc|row\d+|pin|nover|nofill|mmap|mtbloom|nosplit)$"
)


def parse(name: str) -> set[str]:
    """The flags of a configuration's name (``''``: none); an unknown flag is an error."""
    cfg = set(name.split(",")) - {""}
    bad = sorted(f for f in cfg if not FLAGS.match(f))
    if bad:
        raise SystemExit(f"unknown option flag(s) {bad}; see bench/_rocks_configs.py")
    return cfg


def number(cfg: set[str], prefix: str) -> int | None:
    """N of the flag ``<prefix>N`` in cfg, or None."""
    for flag in cfg:
        if flag.startswith(prefix) and flag[len(prefix) :].isdigit():
            return int(flag[len(prefix) :])
    return None


def cache_for(cfg: set[str], default_bytes: int) -> Any:
    """The block cache a store of configuration cfg gets."""
    size = number(cfg, "cache")
    capacity = default_bytes if size is None else size << 20
    if "hcc" in cfg:
        return rocksdict.Cache.new_hyper_clock_cache(capacity, 4096)
    return rocksdict.Cache(capacity)


def configure(opts: rocksdict.Options, cfg: set[str], cache: Any) -> rocksdict.Options:
    """opts (evdb's options of one column family) changed as cfg says; cache: the block
    cache its table files use."""
    if (n := number(cfg, "wb")) is not None:
        opts.set_write_buffer_size(n << 20)
    if (n := number(cfg, "nbuf")) is not None:
        opts.set_max_write_buffer_number(n)
    if (n := number(cfg, "merge")) is not None:
        opts.set_min_write_buffer_number_to_merge(n)
    if "univ" in cfg:
        opts.set_compaction_style(rocksdict.DBCompactionStyle.universal())
    if (n := number(cfg, "l0_")) is not None:
        opts.set_level_zero_file_num_compaction_trigger(n)
    if (n := number(cfg, "jobs")) is not None:
        opts.set_max_background_jobs(n)
    if (n := number(cfg, "lbase")) is not None:
        opts.set_max_bytes_for_level_base(n << 20)
    if (n := number(cfg, "tfile")) is not None:
        opts.set_target_file_size_base(n << 20)
    if "hits" in cfg:
        opts.set_optimize_filters_for_hits(True)
    if "mmap" in cfg:
        opts.set_allow_mmap_reads(True)
    if "mtbloom" in cfg:
        opts.set_memtable_whole_key_filtering(True)
        opts.set_memtable_prefix_bloom_ratio(0.1)
    if (n := number(cfg, "row")) is not None:
        opts.set_row_cache(rocksdict.Cache(n << 20))
    table = rocksdict.BlockBasedOptions()
    bits = number(cfg, "bloom")
    if bits is None:
        table.set_bloom_filter(10, False)
    elif bits:
        table.set_bloom_filter(bits, False)
    if cache is not None:
        table.set_block_cache(cache)
    if (n := number(cfg, "bs")) is not None:
        table.set_block_size(n << 10)
    if "dbhash" in cfg:
        table.set_data_block_index_type(rocksdict.DataBlockIndexType.binary_and_hash())
    if "pin" in cfg:
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    opts.set_block_based_table_factory(table)
    return opts


def read_options(cfg: set[str]) -> rocksdict.ReadOptions:
    """evdb's read options changed as cfg says."""
    return read_options_of(store_options.read_options(), cfg)


@contextmanager
def evdb_options(cfg: set[str]) -> Iterator[None]:
    """Stores evdb opens meanwhile use cfg's options (``store_options.rocks_options`` and
    ``read_options`` wrapped; a store's block cache replaced by cfg's)."""
    base_options: Callable[..., Any] = store_options.rocks_options
    base_read: Callable[[], Any] = store_options.read_options
    caches: dict[int, Any] = {}  # evdb's cache -> cfg's (kept alive with the store's)

    def rocks_options(compression: Any = "lz4", cache: Any = None, mmap_reads: bool = False) -> Any:
        mine = None
        if cache is not None:
            if id(cache) not in caches:
                caches[id(cache)] = (cache, cache_for(cfg, store_options.BLOCK_CACHE_BYTES))
            mine = caches[id(cache)][1]
        return configure(base_options(compression, None, mmap_reads), cfg, mine)

    def patch(options: Any, read: Any) -> None:
        setattr(store_options, "rocks_options", options)  # noqa: B010
        setattr(store, "rocks_options", options)  # noqa: B010
        setattr(store_options, "read_options", read)  # noqa: B010

    patch(rocks_options, lambda: read_options_of(base_read(), cfg))
    split = getattr(rocks, "SPLIT_KEYS", None)
    if "nosplit" in cfg and split is not None:
        rocks.SPLIT_KEYS = 1 << 62
    try:
        yield
    finally:
        patch(base_options, base_read)
        if split is not None:
            rocks.SPLIT_KEYS = split


def read_options_of(opts: rocksdict.ReadOptions, cfg: set[str]) -> rocksdict.ReadOptions:
    """opts changed as cfg says."""
    if "nover" in cfg:
        opts.set_verify_checksums(False)
    if "nofill" in cfg:
        getattr(opts, "fill_cache")(False)  # noqa: B009 (rocksdict's stubs say it takes none)
    return opts
