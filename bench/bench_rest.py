"""REST lookups: evdb serve against the framework floor and against Redis, on loopback.

What is measured: a serving export of ``--rows`` rows (dim ``--dim``, float32, int64 keys
0..rows-1, all cached in DRAM after the warm-up) served by ``evdb serve`` (one worker). Each
request asks for ``--keys`` distinct random keys (a set of 64 pre-built requests, cycled). One
client connection (keep-alive, ``http.client``), one request at a time; the client decodes
every answer into a numpy (keys, dim) float32 array, on every side, so all pay the same.

* ``evdb binary``: ``POST /v1/tables/item/lookup``, int64 keys as raw bytes in, raw float32
  out (``Accept: application/octet-stream``).
* ``evdb json``: the same with a JSON body and a JSON answer (orjson).
* ``evdb v2 binary``: ``POST /v2/models/item/infer``, KServe's binary tensor extension both
  ways (what tritonclient sends).
* ``floor binary`` / ``floor json``: ``bench/_rest_floor.py``, a minimal FastAPI app under the
  same uvicorn that gathers the rows from a numpy array by row number and returns the same
  bytes (JSON: the same document): the cost of the framework and (de)serialisation alone.
* ``redis MGET``: redis-server (Debian's, started here with persistence off) holding each row
  as a 256-byte string, one ``MGET`` of the request's keys through redis-py, values joined
  into the array: how many teams serve embeddings today.

Sides alternate in ``--rounds`` rounds of ``--seconds`` each (at most ``--max-requests``), so
machine noise falls on all of them. Figures: requests/s (total requests / total time), rows/s,
p50 and p99 latency over every request of the side. Aims (issue 7): evdb binary at least 0.8x
the floor's binary requests/s, and more rows/s than Redis.

    python bench/bench_rest.py [--rows 50000] [--keys 1000] [--rounds 5] [--seconds 2]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from _common import cpu_line, fmt_ratio, log, print_table, versions_line, wall_line

import evdb

HERE = Path(__file__).resolve().parent
OCTET = "application/octet-stream"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(port: int, proc: subprocess.Popen[bytes], path: str, what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited before it answered")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status < 500:
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{what} did not answer within 60 s")


def start_redis(tmp: Path) -> tuple[subprocess.Popen[bytes], int] | None:
    """redis-server from Debian (installed here when missing and apt-get can); None if not."""
    if shutil.which("redis-server") is None and shutil.which("apt-get") is not None:
        log("installing redis-server (Debian) for the comparison ...")
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "redis-server"],
            capture_output=True,
            check=False,
        )
    if shutil.which("redis-server") is None:
        return None
    port = free_port()
    cmd = ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"]
    cmd += ["--dir", str(tmp), "--bind", "127.0.0.1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


def measure(
    call: Callable[[int], Any], n_requests: int, seconds: float, lat: list[float]
) -> tuple[int, float]:
    """Calls ``call(i)`` for i = 0, 1, ... until ``seconds`` pass or ``n_requests`` are done;
    appends each latency to ``lat``; returns (requests, seconds)."""
    start = time.perf_counter()
    done = 0
    while done < n_requests:
        t0 = time.perf_counter()
        call(done)
        t1 = time.perf_counter()
        lat.append(t1 - t0)
        done += 1
        if t1 - start > seconds:
            break
    return done, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--keys", type=int, default=1000, help="keys per request")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="per side per round")
    ap.add_argument("--max-requests", type=int, default=5000, help="per side per round")
    ap.add_argument("--quick", action="store_true", help="small and short: a smoke run")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.rounds, args.seconds = 5000, 2, 0.3

    tmp = Path(tempfile.mkdtemp(prefix="evdb-bench-rest-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        run(args, tmp, procs)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print(wall_line())


def run(args: argparse.Namespace, tmp: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    rng = np.random.default_rng(0)
    values = (rng.standard_normal((args.rows, args.dim), dtype=np.float32) * 0.05).astype(
        np.float32
    )
    keys = np.arange(args.rows, dtype=np.int64)
    log(f"building a serving export of {args.rows:,} rows ...")
    with evdb.open(tmp / "db") as db:
        t = db.create_table("item", dim=args.dim, dram_rows=None)
        for s in range(0, args.rows, 65536):
            t.upsert(keys[s : s + 65536], values[s : s + 65536])
        evdb.export(db, tmp / "snap", chunk_rows=max(65536, args.rows))
    np.save(tmp / "values.npy", values)

    quiet = subprocess.DEVNULL
    evdb_port, floor_port = free_port(), free_port()
    serve = [sys.executable, "-m", "evdb", "serve", str(tmp / "snap"), "--port", str(evdb_port)]
    serve += ["--log-level", "warning", "--max-keys", str(max(args.keys, 100_000))]
    procs.append(subprocess.Popen(serve, stdout=quiet, stderr=quiet))
    floor = [sys.executable, "-m", "uvicorn", "_rest_floor:app", "--port", str(floor_port)]
    floor += ["--log-level", "warning", "--no-access-log"]
    floor_env = {**os.environ, "FLOOR_VALUES": str(tmp / "values.npy")}
    procs.append(subprocess.Popen(floor, cwd=HERE, env=floor_env, stdout=quiet, stderr=quiet))
    redis = start_redis(tmp)
    wait_http(evdb_port, procs[0], "/readyz", "evdb serve")
    wait_http(floor_port, procs[1], "/docs", "the floor app")
    requests = [rng.choice(args.rows, args.keys, replace=False) for _ in range(64)]

    evdb_conn = http.client.HTTPConnection("127.0.0.1", evdb_port)
    floor_conn = http.client.HTTPConnection("127.0.0.1", floor_port)

    def post(conn: http.client.HTTPConnection, url: str, body: bytes, headers: dict[str, str]):
        conn.request("POST", url, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise SystemExit(f"{url}: {r.status} {data[:300]!r}")
        return r, data

    bin_bodies = [k.tobytes() for k in requests]
    json_bodies = [orjson.dumps({"keys": k}, option=orjson.OPT_SERIALIZE_NUMPY) for k in requests]
    bin_headers = {"content-type": OCTET, "accept": OCTET}
    json_headers = {"content-type": "application/json"}
    infer_bodies = []
    for k in requests:
        head = json.dumps(
            {
                "inputs": [
                    {
                        "name": "keys",
                        "shape": [len(k)],
                        "datatype": "INT64",
                        "parameters": {"binary_data_size": k.nbytes},
                    }
                ],
                "outputs": [{"name": "embeddings", "parameters": {"binary_data": True}}],
            }
        ).encode()
        infer_bodies.append((head + k.tobytes(), str(len(head))))

    def evdb_binary(i: int) -> np.ndarray:
        _, data = post(evdb_conn, "/v1/tables/item/lookup", bin_bodies[i % 64], bin_headers)
        return np.frombuffer(data, dtype="<f4").reshape(-1, args.dim)

    def floor_binary(i: int) -> np.ndarray:
        _, data = post(floor_conn, "/lookup", bin_bodies[i % 64], bin_headers)
        return np.frombuffer(data, dtype="<f4").reshape(-1, args.dim)

    def evdb_json(i: int) -> np.ndarray:
        _, data = post(evdb_conn, "/v1/tables/item/lookup", json_bodies[i % 64], json_headers)
        return np.array(orjson.loads(data)["embeddings"], dtype=np.float32)

    def floor_json(i: int) -> np.ndarray:
        _, data = post(floor_conn, "/lookup", json_bodies[i % 64], json_headers)
        return np.array(orjson.loads(data)["embeddings"], dtype=np.float32)

    def evdb_v2(i: int) -> np.ndarray:
        body, n = infer_bodies[i % 64]
        r, data = post(
            evdb_conn, "/v2/models/item/infer", body, {"Inference-Header-Content-Length": n}
        )
        at = int(r.headers["Inference-Header-Content-Length"])
        return np.frombuffer(data[at:], dtype="<f4").reshape(-1, args.dim)

    sides: dict[str, Callable[[int], np.ndarray]] = {
        "evdb binary": evdb_binary,
        "floor binary": floor_binary,
        "evdb json": evdb_json,
        "floor json": floor_json,
        "evdb v2 binary": evdb_v2,
    }
    if redis is not None:
        import redis as redis_py  # the bench's own dependency (make bench installs it)

        procs.append(redis[0])
        client = redis_py.Redis(port=redis[1])
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis_py.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        log(f"loading {args.rows:,} rows into redis ...")
        pipe = client.pipeline(transaction=False)
        for s in range(0, args.rows, 5000):
            for k in range(s, min(s + 5000, args.rows)):  # setup only, not measured
                pipe.set(f"item:{k}", values[k].tobytes())
            pipe.execute()
        redis_keys = [[f"item:{k}" for k in r] for r in requests]

        def redis_mget(i: int) -> np.ndarray:
            got = client.mget(redis_keys[i % 64])
            return np.frombuffer(b"".join(got), dtype="<f4").reshape(-1, args.dim)

        sides["redis MGET"] = redis_mget
    else:
        log("redis-server is not available: its column is skipped")

    # Same rows from every side (and the warm-up: evdb caches the rows it reads).
    want = values[requests[0]]
    for name, call in sides.items():
        for i in range(128):
            got = call(i)
        got = call(0)
        if not np.array_equal(got, want):
            raise SystemExit(f"{name}: the rows differ from the stored values")
    log("every side returns the stored rows bit for bit")

    lat: dict[str, list[float]] = {name: [] for name in sides}
    totals = {name: [0, 0.0] for name in sides}
    names = list(sides)
    for rnd in range(args.rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for name in order:
            # A fresh connection per turn (http.client reconnects by itself): uvicorn closes
            # one that sat idle 5 s while the other sides ran.
            evdb_conn.close()
            floor_conn.close()
            n, secs = measure(sides[name], args.max_requests, args.seconds, lat[name])
            totals[name][0] += n
            totals[name][1] += secs
        log(f"round {rnd + 1}/{args.rounds} done")

    print("REST lookups on loopback: evdb serve vs a minimal FastAPI app (floor) vs Redis")
    print(cpu_line())
    print(versions_line("-"))
    print(
        f"workload    {args.rows:,} rows, dim {args.dim}, float32, all in DRAM; "
        f"{args.keys:,} distinct random keys per request; one connection, one request at a "
        f"time; {args.rounds} rounds x {args.seconds:g} s per side, sides alternating"
    )
    rate = {name: totals[name][0] / totals[name][1] for name in sides}
    rows = []
    for name in sides:
        ms = np.array(lat[name]) * 1e3
        base = "floor binary" if "binary" in name else "floor json"
        vs_floor = rate[name] / rate[base] if name.startswith("evdb") else None
        vs_redis = rate[name] / rate["redis MGET"] if "redis MGET" in rate else None
        rows.append(
            [
                name,
                f"{rate[name]:,.0f}",
                f"{rate[name] * args.keys / 1e6:.2f}M",
                f"{np.percentile(ms, 50):.3f}",
                f"{np.percentile(ms, 99):.3f}",
                fmt_ratio(vs_floor),
                fmt_ratio(vs_redis) if name != "redis MGET" else "-",
                f"{totals[name][0]:,}",
            ]
        )
    print_table(
        ["side", "req/s", "rows/s", "p50 ms", "p99 ms", "vs floor", "vs redis", "requests"],
        rows,
        first_left=1,
    )
    print(
        "aims: evdb binary >= 0.95x floor binary (the speed issue; 0.80x before) "
        f"({fmt_ratio(rate['evdb binary'] / rate['floor binary'])}); evdb binary > redis MGET "
        + (
            f"({fmt_ratio(rate['evdb binary'] / rate['redis MGET'])})"
            if "redis MGET" in rate
            else "(redis not run)"
        )
    )


if __name__ == "__main__":
    main()
