"""The service's settings, read once from ``EVDB_*`` environment variables.

The only place in evdb that reads the environment (STYLE.md 2.2). ``evdb serve`` sets these
variables for its uvicorn workers; tests build a :class:`Settings` directly and pass it to
``create_app`` (or override the ``get_settings`` dependency), as in fastapi's settings docs.

=========================  ==============================================================
variable                   meaning
=========================  ==============================================================
``EVDB_PATH``              the database or serving export to serve, opened read-only
``EVDB_FOLLOW_ROOT``       a publish root to follow instead (``evdb serve ROOT --follow``)
``EVDB_POLL_INTERVAL``     seconds between a follower's polls of HEAD (default 1, jittered)
``EVDB_FOLLOW_DTYPE``      following: ``float32`` (default: as published), or ``int8`` /
                           ``int4``: each full quantised on load, deltas as applied
``EVDB_FOLLOW_CACHE``      following quantised: where each worker's quantised fulls are
                           written (default: the system's temporary folder)
``EVDB_MAX_STALENESS``     seconds: following, /readyz is 503 when the publication served is
                           older (default: staleness never makes it unready)
``EVDB_TOKEN_FILE``        a file holding the admin bearer token; without it, no admin
``EVDB_ALLOW_ROOTS``       directories (``os.pathsep``-separated) reload may open from
``EVDB_MAX_KEYS``          most keys in one request (default 100,000)
``EVDB_CACHE_ROWS``        rows of each table kept in DRAM (default: the snapshot's own)
``EVDB_DASHBOARD``         ``0``: no ``/dashboard`` page and no ``/v1/dashboard`` routes
``EVDB_SAMPLE_INTERVAL_S`` seconds between the dashboard's samples of the metrics (default 5)
``EVDB_MAX_SCAN_ROWS``     the largest table a neighbours query scans (default 2,000,000)
``EVDB_GRPC_PORT``         serve the KServe v2 gRPC protocol on this port too (0: a free
                           one; default: no gRPC), beside HTTP, from the same snapshot
``EVDB_GRPC_HOST``         the address gRPC binds (default 127.0.0.1)
``EVDB_WORKERS``           worker processes ``evdb serve`` started (shown on the dashboard)
``EVDB_PATH_VERIFIED``     ``1``: ``EVDB_PATH``'s checksums were checked (by ``evdb serve``,
                           once for all its workers), so workers do not read them again
``EVDB_STATE_FILE``        with several workers: the file through which a reload that one
                           worker took tells the others (``evdb serve`` makes it)
``PROMETHEUS_MULTIPROC_    with several workers: prometheus-client's folder of per-process
DIR``                      metric files, which ``/metrics`` sums (``evdb serve`` makes it)
=========================  ==============================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

DEFAULT_MAX_KEYS = 100_000
DEFAULT_MAX_SCAN_ROWS = 2_000_000
FOLLOW_DTYPES = ("float32", "int8", "int4")  # how a follower serves its rows


@dataclass(frozen=True)
class Settings:
    path: Path | None = None
    follow_root: Path | None = None
    poll_interval_s: float = 1.0
    follow_dtype: str = "float32"
    follow_cache: Path | None = None
    max_staleness_s: float | None = None
    token: str | None = None
    allow_roots: tuple[Path, ...] = field(default_factory=tuple)
    max_keys: int = DEFAULT_MAX_KEYS
    cache_rows: int | None = None
    mmap_reads: bool = False
    path_verified: bool = False
    state_file: Path | None = None
    metrics_dir: Path | None = None
    dashboard: bool = True
    sample_interval_s: float = 5.0
    max_scan_rows: int = DEFAULT_MAX_SCAN_ROWS
    workers: int = 1
    grpc_port: int | None = None
    grpc_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if self.max_keys < 1:
            raise ValueError(f"max_keys must be at least 1, got {self.max_keys}")
        if not self.sample_interval_s > 0:
            raise ValueError(f"sample_interval_s must be > 0, got {self.sample_interval_s}")
        if self.grpc_port is not None and not 0 <= self.grpc_port <= 65535:
            raise ValueError(f"grpc_port must be in [0, 65535], got {self.grpc_port}")
        if self.follow_dtype not in FOLLOW_DTYPES:
            raise ValueError(
                f"follow_dtype must be one of {', '.join(FOLLOW_DTYPES)}, got {self.follow_dtype!r}"
            )
        if self.max_scan_rows < 1:
            raise ValueError(f"max_scan_rows must be at least 1, got {self.max_scan_rows}")

    @property
    def max_body_bytes(self) -> int:
        """The largest request body read: room for max_keys keys of 20 digits with weights
        (JSON) and offsets, so a huge body is refused before it is buffered."""
        return 64 * self.max_keys + (1 << 20)


def read_token(path: Path) -> str:
    """The bearer token in ``path`` (surrounding whitespace dropped); an empty file is an
    error, since an empty token would let anyone in."""
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process, from the environment (cached: read once)."""
    env = os.environ
    token_file = env.get("EVDB_TOKEN_FILE")
    roots = env.get("EVDB_ALLOW_ROOTS", "")
    state = env.get("EVDB_STATE_FILE")
    metrics_dir = env.get("PROMETHEUS_MULTIPROC_DIR")
    return Settings(
        path=Path(env["EVDB_PATH"]) if env.get("EVDB_PATH") else None,
        follow_root=Path(env["EVDB_FOLLOW_ROOT"]) if env.get("EVDB_FOLLOW_ROOT") else None,
        poll_interval_s=float(env.get("EVDB_POLL_INTERVAL", "1")),
        follow_dtype=env.get("EVDB_FOLLOW_DTYPE", "float32"),
        follow_cache=Path(env["EVDB_FOLLOW_CACHE"]) if env.get("EVDB_FOLLOW_CACHE") else None,
        max_staleness_s=float(env["EVDB_MAX_STALENESS"]) if env.get("EVDB_MAX_STALENESS") else None,
        token=read_token(Path(token_file)) if token_file else None,
        allow_roots=tuple(Path(r).resolve() for r in roots.split(os.pathsep) if r),
        max_keys=int(env.get("EVDB_MAX_KEYS", DEFAULT_MAX_KEYS)),
        cache_rows=int(env["EVDB_CACHE_ROWS"]) if env.get("EVDB_CACHE_ROWS") else None,
        mmap_reads=env.get("EVDB_MMAP_READS") == "1",
        path_verified=env.get("EVDB_PATH_VERIFIED") == "1",
        state_file=Path(state) if state else None,
        metrics_dir=Path(metrics_dir) if metrics_dir else None,
        dashboard=env.get("EVDB_DASHBOARD", "1") != "0",
        sample_interval_s=float(env.get("EVDB_SAMPLE_INTERVAL_S", "5")),
        max_scan_rows=int(env.get("EVDB_MAX_SCAN_ROWS", DEFAULT_MAX_SCAN_ROWS)),
        workers=int(env.get("EVDB_WORKERS", "1")),
        grpc_port=int(env["EVDB_GRPC_PORT"]) if env.get("EVDB_GRPC_PORT") else None,
        grpc_host=env.get("EVDB_GRPC_HOST", "127.0.0.1"),
    )
