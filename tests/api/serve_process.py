"""``evdb serve`` as a real process on a free loopback port, for the tests that need one.

``start`` runs ``python -m evdb serve ARGS --port P --log-level warning`` and returns once
``/readyz`` answers 200 (at most 90 s; a server that exits or never gets ready fails the test
with its output); ``stop`` sends SIGINT and returns its output and exit code (killed after
30 s).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str, int]:
    """(process, base URL, port) of a ready server."""
    port = free_port()
    cmd = [sys.executable, "-m", "evdb", "serve", *args, "--port", str(port)]
    cmd += ["--log-level", "warning"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return proc, url, port
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"evdb serve did not start: {proc.communicate()[0][-2000:]}")
        time.sleep(0.2)


def stop(proc: subprocess.Popen[str]) -> tuple[int | None, str]:
    """SIGINT, then (exit code, output); a server that does not stop in 30 s is killed."""
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return None, out
    return proc.returncode, out
