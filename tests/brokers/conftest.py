"""Fixtures for the metrics sources: real Redis (shared, uuid-prefixed keys), throwaway
password-protected Redis servers, and the real RabbitMQ (management API on loopback)."""

from __future__ import annotations

import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import REDIS_URL

SECRET = "Zq9-hunter2-SECRET-pw"  # distinctive: must never appear in any output


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def prefix() -> Iterator[str]:
    """A unique key prefix on the shared Redis; every key under it is deleted afterwards."""
    p = f"t-{uuid.uuid4().hex[:12]}:"
    yield p
    r = redis.Redis.from_url(REDIS_URL)
    keys = list(r.scan_iter(match=f"{p}*", count=1000))
    if keys:
        r.delete(*keys)
    r.close()


@pytest.fixture
def rclient() -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(REDIS_URL)
    yield r
    r.close()


class RedisServer:
    def __init__(self, password: str, tls_dir: Path | None = None) -> None:
        self.port = free_port()
        self.password = password
        self.tls_dir = tls_dir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.tls_dir is not None:
            return (
                f"rediss://:{self.password}@127.0.0.1:{self.port}/0"
                f"?ssl_ca_certs={self.tls_dir / 'cert.pem'}"
            )
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--requirepass",
            self.password,
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        if self.tls_dir is None:
            args += ["--port", str(self.port)]
        else:
            args += [
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                str(self.tls_dir / "cert.pem"),
                "--tls-key-file",
                str(self.tls_dir / "key.pem"),
                "--tls-auth-clients",
                "no",
            ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                r = redis.Redis.from_url(self.url)
                r.ping()
                r.close()
                return
            except redis.RedisError:
                time.sleep(0.02)
        raise RuntimeError("throwaway redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def tls_redis(tmp_path) -> Iterator[RedisServer]:
    """A throwaway TLS-only redis-server (self-signed certificate for 127.0.0.1)."""
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(tmp_path / "key.pem"),
            "-out",
            str(tmp_path / "cert.pem"),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    server = RedisServer(SECRET, tls_dir=tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A throwaway redis-server with a distinctive password, killed afterwards."""
    server = RedisServer(SECRET)
    server.start()
    try:
        yield server
    finally:
        server.stop()
