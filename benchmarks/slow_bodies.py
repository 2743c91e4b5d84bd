"""Slow request bodies against `autoscaler serve`: the server's resident memory before, while and
after N unauthenticated connections each hold most of a body that never ends.

    python benchmarks/slow_bodies.py [--connections 120] [--held-kib 1023] [--body-kib 1024]
                                     [--hold 20] [--tree PATH] [--serve-env NAME=VALUE]

The issue's probe (#33, "Slow bodies"): 120 connections, each sending the headers of a 1 MiB
`PUT /v1/admin/config` and 1,023 KiB of its body, then nothing, for `--hold` seconds; then all
closed. `autoscaler serve` runs as a real process on a free loopback port, on a throwaway SQLite
store (`autoscaler db upgrade` in a temporary folder), from `--tree` (this checkout by default:
point it at an export of another commit to measure that one). Printed: the server's VmRSS
before, its highest while the connections are held, 5 s after they are closed; what each
connection was answered (and when, from its last byte sent); and /healthz's answer time while
they are held.

Measured on the 2-CPU VM (December 2026), 120 connections x 1,023 KiB, hold 20 s:

  before (one FIFO, no deadline): RSS 88 -> 211 MB (+123 MB) held, 211 MB 5 s after the close
    (+123 MB not returned); no connection answered while held.
  after (10 s deadline, 8 MiB per address, one source address): RSS 117 -> 128 MB (+10 MB)
    at the peak, 117 MB 5 s after the close (+0 MB); 8 answered 408 at 10.0 s, 112 refused 429
    at once; /healthz while held: median 5 ms, max 7 ms (79 asked).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status_of(s: socket.socket) -> int | None:
    """The status line's code if an answer has come (non-blocking), else None."""
    try:
        data = s.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, TimeoutError):
        return None
    except OSError:
        return -1  # reset: closed by the server
    if not data:
        return -1
    try:
        return int(data.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--connections", type=int, default=120)
    ap.add_argument("--held-kib", type=int, default=1023)
    ap.add_argument("--body-kib", type=int, default=1024)
    ap.add_argument("--hold", type=float, default=20.0)
    ap.add_argument(
        "--addresses", type=int, default=1, help="source addresses 127.0.0.2, .3, … in turn"
    )
    ap.add_argument("--tree", default=str(ROOT), help="the source tree to serve from")
    ap.add_argument("--serve-env", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args()

    home = tempfile.mkdtemp(prefix="slow-bodies-")
    env = {
        **os.environ,
        "PYTHONPATH": args.tree,
        "AUTOSCALER_HOME": home,
        "AUTOSCALER_DATABASE_URL": f"sqlite:///{home}/state.db",
    }
    env.update(kv.split("=", 1) for kv in args.serve_env)
    subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "db", "upgrade"],
        env=env,
        cwd=args.tree,
        check=True,
        capture_output=True,
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autoscaler.cli",
            "serve",
            "--bind",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
        ],
        env=env,
        cwd=args.tree,
        start_new_session=True,
    )
    conns: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(requests.ConnectionError):
                if requests.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the API did not start"
            time.sleep(0.2)
        for _ in range(20):  # warm: the runtime, the pool, the routes
            requests.get(f"{base}/healthz", timeout=5)
            requests.put(f"{base}/v1/admin/config", json={"yaml": "x"}, timeout=5)
        time.sleep(1)
        before = rss_mb(server.pid)
        head = (
            f"PUT /v1/admin/config HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {args.body_kib * 1024}\r\n\r\n"
        ).encode()
        chunk = b"x" * 1024
        sent_at: dict[int, float] = {}
        for i in range(args.connections):
            source = f"127.0.0.{2 + i % args.addresses}" if args.addresses > 1 else "127.0.0.1"
            s = socket.create_connection(("127.0.0.1", port), timeout=2, source_address=(source, 0))
            s.sendall(head)
            try:
                for _ in range(args.held_kib):
                    s.sendall(chunk)
            except OSError:
                pass  # answered and closed while sending: refused
            sent_at[i] = time.monotonic()
            s.setblocking(False)
            conns.append(s)
            if i % 20 == 19:
                print(f"  {i + 1} sent, RSS {rss_mb(server.pid):.0f} MB", file=sys.stderr)
        peak = rss_mb(server.pid)
        answered: dict[int, tuple[int, float]] = {}
        health: list[float] = []
        end = time.monotonic() + args.hold
        while time.monotonic() < end:
            for i, s in enumerate(conns):
                if i not in answered and (code := status_of(s)) is not None:
                    answered[i] = (code, time.monotonic() - sent_at[i])
            peak = max(peak, rss_mb(server.pid))
            t = time.monotonic()
            try:
                requests.get(f"{base}/healthz", timeout=10)
                health.append(time.monotonic() - t)
            except requests.RequestException:
                health.append(float("inf"))
            time.sleep(0.25)
        held = rss_mb(server.pid)
        for s in conns:
            s.close()
        conns.clear()
        time.sleep(5)
        after = rss_mb(server.pid)
        codes = Counter(code for code, _ in answered.values())
        waits = sorted(w for _, w in answered.values())
        print(f"tree: {args.tree}; {args.addresses} source address(es)")
        print(
            f"{args.connections} connections x {args.held_kib} KiB of {args.body_kib} KiB, "
            f"held {args.hold:.0f} s"
        )
        print(
            f"RSS MB: before {before:.0f}, peak {peak:.0f} (+{peak - before:.0f}), "
            f"end of hold {held:.0f}, 5 s after close {after:.0f} (+{after - before:.0f})"
        )
        print(f"answered while held: {dict(codes)}; unanswered {args.connections - len(answered)}")
        if waits:
            print(f"answer after its last byte: min {waits[0]:.2f} s, max {waits[-1]:.2f} s")
        if health:
            ordered = sorted(health)
            print(
                f"/healthz while held: {len(health)} asked, median "
                f"{ordered[len(ordered) // 2] * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"
            )
    finally:
        for s in conns:
            s.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)


if __name__ == "__main__":
    main()
