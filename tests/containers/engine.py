"""A real Podman engine for the tests: its API service on a socket of our own, the base image,
and podman itself for what a human would do by hand.

Podman runs here with `CONTAINERS_CONF=scripts/containers.conf` (this host refuses podman's
default ulimits). `podman_service()` starts `podman system service --time=0` on a socket in a
folder of its own, waits until the API answers, and stops it afterwards (the service also dies
with the test process: PR_SET_PDEATHSIG). `ensure_base_image()` builds the small Debian image
with `scripts/images.sh --base-only` (idempotent; `TEST_CONTAINER_IMAGE` names another image).

Every test container is labelled (`TEST_LABEL`=this run's id) or owned by a per-test
installation id, so `remove_containers` clears them without touching anyone else's — the
engine's storage is shared with whatever else runs podman on this machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = REPO / "scripts" / "containers.conf"
IMAGES_SCRIPT = REPO / "scripts" / "images.sh"
BASE_IMAGE = "localhost/gpu-queue-autoscaler-base:bookworm"
TEST_LABEL = "io.gpu-queue-autoscaler.test-run"
RUN_ID = uuid.uuid4().hex[:12]
"""This test process's id: the value of `TEST_LABEL` on the containers it makes by hand."""


class EngineUnavailable(RuntimeError):
    """No podman on this machine: the tests that need one fail with this (never skip);
    `bash scripts/images.sh` installs it."""


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def run(
    argv: list[str], *, cwd: Path | None = None, check: bool = True, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run a podman tool (podman, podman-compose) with this host's podman settings, output
    captured; a tool that is not installed fails with how to get it."""
    if shutil.which(argv[0]) is None:
        raise EngineUnavailable(f"{argv[0]} is not installed: bash scripts/images.sh installs it")
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=podman_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-3000:]}"
        )
    return done


def podman(
    *args: str, check: bool = True, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run the podman command (as a human would, beside the API), output captured."""
    return run(["podman", *args], check=check, timeout=timeout)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _answers(path: Path) -> bool:
    """True once the API answers GET /_ping on the socket."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2.0)
            s.connect(str(path))
            s.sendall(b"GET /_ping HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


@contextlib.contextmanager
def podman_service(timeout: float = 30.0) -> Iterator[str]:
    """A Podman API service for the duration of the block; yields its URL (unix://...)."""
    if shutil.which("podman") is None:
        raise EngineUnavailable("podman is not installed: bash scripts/images.sh installs it")
    folder = Path(tempfile.mkdtemp(prefix="podman-api-"))
    sock = folder / "podman.sock"
    log = open(folder / "service.log", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{sock}"],
        env=podman_env(),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent,  # the tests' process is single-threaded here
    )
    try:
        deadline = time.monotonic() + timeout
        while not _answers(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"podman system service did not answer on {sock}: "
                    f"{(folder / 'service.log').read_text(errors='replace')[-2000:]}"
                )
            time.sleep(0.05)
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def image_exists(image: str) -> bool:
    return podman("image", "exists", image, check=False).returncode == 0


def ensure_base_image(timeout: float = 1800.0) -> str:
    """The image provider tests run containers of: `TEST_CONTAINER_IMAGE` if set, else the base
    image, built (or found up to date) by `scripts/images.sh --base-only`."""
    override = os.environ.get("TEST_CONTAINER_IMAGE")
    if override:
        if not image_exists(override):
            raise RuntimeError(f"TEST_CONTAINER_IMAGE={override} is not in podman's storage")
        return override
    if IMAGES_SCRIPT.exists():
        with _build_lock():
            done = _build_base(timeout)
        if done.returncode != 0:
            raise RuntimeError(
                f"bash scripts/images.sh --base-only failed ({done.returncode}):\n"
                f"{(done.stdout + done.stderr)[-3000:]}"
            )
    if not image_exists(BASE_IMAGE):
        raise RuntimeError(
            f"{BASE_IMAGE} is missing; build it with 'bash scripts/images.sh --base-only' "
            "(or name another image in TEST_CONTAINER_IMAGE)"
        )
    return BASE_IMAGE


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """One `images.sh --base-only` at a time on this machine: test modules on other xdist
    workers (tests/security/test_container_walls.py) may ensure the image at the same time."""
    import fcntl

    path = Path(tempfile.gettempdir()) / "gpu-queue-autoscaler-base-image.lock"
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_base(timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(IMAGES_SCRIPT), "--base-only"],
        env=podman_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
    )


def container_ids(*filters: str) -> list[str]:
    """Ids of every container (any state) matching all of podman's `--filter`s."""
    args = ["ps", "-a", "--no-trunc", "--format", "{{.ID}}"]
    for f in filters:
        args += ["--filter", f]
    return podman(*args).stdout.split()


def remove_containers(*filters: str) -> None:
    """Remove, at once, every container matching the filters (teardown)."""
    ids = container_ids(*filters)
    if ids:
        podman("rm", "--force", "--time", "0", *ids, check=False, timeout=120)


def run_by_hand(image: str, name: str, *, labels: dict[str, str] | None = None) -> str:
    """A container made by a human with podman (sleeping), tagged with this run's test label;
    returns its id."""
    args = ["run", "-d", "--name", name, "--label", f"{TEST_LABEL}={RUN_ID}", "--init"]
    for key, value in (labels or {}).items():
        args += ["--label", f"{key}={value}"]
    return podman(*args, image, "sleep", "infinity").stdout.strip()


def remove_owned_by(installation: str, label_key: str = "io.gpu-queue-autoscaler.label") -> None:
    """Remove every container whose ownership label names `installation` (teardown of a test
    that used a fresh installation id)."""
    listed = podman("ps", "-a", "--filter", f"label={label_key}", "--format", "json").stdout
    prefix = f"asg-{installation}-"
    ids = [
        c["Id"]
        for c in json.loads(listed or "[]")
        if str((c.get("Labels") or {}).get(label_key, "")).startswith(prefix)
    ]
    if ids:
        podman("rm", "--force", "--time", "0", *ids, check=False, timeout=120)


@dataclass(frozen=True)
class Engine:
    """A running engine for tests: its API's URL and the image to run."""

    url: str
    image: str


@contextlib.contextmanager
def podman_engine() -> Iterator[Engine]:
    """The base image ensured, then the API service for the block; the containers made by
    hand in it (`run_by_hand`) are removed at the end."""
    image = ensure_base_image()
    with podman_service() as url:
        try:
            yield Engine(url, image)
        finally:
            remove_containers(f"label={TEST_LABEL}={RUN_ID}")


def make_certificates(folder: Path, host: str = "127.0.0.1") -> dict[str, Path]:
    """A CA, a server certificate for `host` and a client certificate it signed, and a second,
    unrelated CA: PEM files in `folder` (ca, server_cert, server_key, client_cert, client_key,
    other_ca)."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def write(path: Path, data: bytes) -> Path:
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def pem_key(k: ec.EllipticCurvePrivateKey) -> bytes:
        return k.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        k = key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(name(cn))
            .public_key(k.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(k.public_key()), False)
            .sign(k, hashes.SHA256())
        )
        return cert, k

    def leaf(
        cn: str, issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], server: bool
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        k = key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(issuer[0].subject)
            .public_key(k.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer[1].public_key()), False
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), False
            )
        return builder.sign(issuer[1], hashes.SHA256()), k

    root = ca("test engine CA")
    server = leaf(host, root, server=True)
    client = leaf("autoscaler", root, server=False)
    other = ca("another CA")
    pem = serialization.Encoding.PEM
    return {
        "ca": write(folder / "ca.pem", root[0].public_bytes(pem)),
        "server_cert": write(folder / "server.pem", server[0].public_bytes(pem)),
        "server_key": write(folder / "server-key.pem", pem_key(server[1])),
        "client_cert": write(folder / "cert.pem", client[0].public_bytes(pem)),
        "client_key": write(folder / "key.pem", pem_key(client[1])),
        "other_ca": write(folder / "other-ca.pem", other[0].public_bytes(pem)),
    }


@contextlib.contextmanager
def tls_front(socket_url: str, certs: dict[str, Path]) -> Iterator[str]:
    """An engine API behind mutual TLS on loopback, as `dockerd --tlsverify` serves it: a
    proxy that asks every client for a certificate signed by `certs["ca"]` and forwards the
    bytes to the engine's unix socket. Yields tcp://127.0.0.1:<port>."""
    import select
    import ssl
    import threading

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs["server_cert"], certs["server_key"])
    context.load_verify_locations(certs["ca"])
    context.verify_mode = ssl.CERT_REQUIRED
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    target = socket_url.removeprefix("unix://")
    stop = threading.Event()

    def serve(raw: socket.socket) -> None:
        try:
            conn = context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            raw.close()  # no certificate, or not one our CA signed: refused
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # One thread per connection, reading whichever side is ready: an SSL socket must not
        # be read and written from two threads at once.
        with contextlib.suppress(OSError), conn, upstream:
            upstream.connect(target)
            while not stop.is_set():
                ready, _, _ = select.select([conn, upstream], [], [], 30)
                if not ready:
                    return
                for side in ready:
                    data = side.recv(65536)
                    if not data:
                        return
                    (upstream if side is conn else conn).sendall(data)
                while conn.pending():
                    upstream.sendall(conn.recv(conn.pending()))

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            raw.settimeout(30)
            threading.Thread(target=serve, args=(raw,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        stop.set()
        acceptor.join(5)
        listener.close()
