"""Containers of the `container` provider are walled off from the host's loopback.

A worker container runs code the team did not vet line by line (a queue's repository and its
requirements). On the host's own network it reached everything listening on the host's
loopback: the control plane's broker answered PONG, and an engine API on tcp://127.0.0.1 without
TLS listed containers (root on the host). Now:

- a container made with the provider's defaults gets the engine's bridge network: a server on
  the host's 127.0.0.1 is out of its reach, by any address (its own 127.0.0.1, the gateway, the
  host's other addresses, slirp4netns' 10.0.2.2), while a server on the host's non-loopback
  address (`host.containers.internal`) answers it, as the control plane's API and broker do
  when they are given to the worker that way;
- `network: host` is refused unless `unsafe_host_network: true` sits beside it, and with that
  opt-in the same probe does reach the loopback server (the probe sees what it should);
- an engine API on tcp:// without TLS is refused, loopback included, by the config and by the
  provider at build (DOCKER_HOST too).

Against a real Podman engine (`tests/containers/engine.py`); the engine's tests run on one xdist
worker (`container-engine`), and every container here belongs to a fresh installation id.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import threading
import uuid
from collections.abc import Iterator

import pytest

from autoscaler.access.credentials import validate_provider
from autoscaler.config import ConfigError
from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.config.provider_options import ContainerOptions
from autoscaler.providers import LaunchSpec, ProviderRequestError
from autoscaler.providers.container import ContainerProvider
from tests.containers import engine as kit
from tests.containers.engine import Engine

ENGINE_GROUP = pytest.mark.xdist_group("container-engine")
"""The one engine of this machine: its tests run on one xdist worker (tests/conftest.py)."""

PROBE = r"""
import socket, sys
port, token = int(sys.argv[1]), sys.argv[2].encode()
for host in sys.argv[3:]:
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            s.settimeout(3)
            got = b""
            while len(got) < len(token):
                chunk = s.recv(64)
                if not chunk:
                    break
                got += chunk
        print(host, "REACHED" if got == token else "other")
    except OSError as e:
        print(host, "no", type(e).__name__)
"""
"""Connects to each host at `port` and says REACHED only when the listener's token came back
(some networks answer any connection: only our listener knows the token)."""


@contextlib.contextmanager
def listener(address: str) -> Iterator[tuple[int, str]]:
    """A TCP server on `address` that sends a fresh token to whoever connects; (port, token)."""
    token = secrets.token_hex(16)
    server = socket.create_server((address, 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with contextlib.suppress(OSError), conn:
                conn.sendall(token.encode())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], token
    finally:
        stop.set()
        thread.join(5)
        server.close()


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with kit.podman_engine() as e:
        yield e


@pytest.fixture
def installation() -> Iterator[str]:
    inst = f"t{uuid.uuid4().hex[:15]}"
    try:
        yield inst
    finally:
        kit.remove_owned_by(inst)


def provider(engine: Engine, installation: str, **options: object) -> ContainerProvider:
    """The provider with its defaults: only the engine, no GPU and a sleeping command."""
    config = ContainerOptions.model_validate(
        {
            "kind": "container",
            "url": engine.url,
            "gpus": 0,
            "command": ["sleep", "infinity"],
            **options,
        }
    )
    return ContainerProvider("gpu-box", config, installation, timeout=30.0, grace=0.0)


def started(p: ContainerProvider, engine: Engine, installation: str) -> str:
    spec = InstanceSpec.model_validate(
        {"gpu": "RTX 4090", "disk_gb": 10, "max_price_per_hour": 1.0, "image": engine.image}
    )
    offer = p.find_offers(spec)[0]
    machine = p.create(offer, LaunchSpec.new(installation, uuid.uuid4().hex, {"QUEUE": "walls"}))
    return machine.provider_instance_id


def probe(container: str, port: int, token: str, *hosts: str) -> dict[str, str]:
    done = kit.podman(
        "exec", container, "python3", "-c", PROBE, str(port), token, *hosts, timeout=120
    )
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.strip())


def host_address(container: str) -> str:
    """What `host.containers.internal` is in the container: the host's address on the
    container's network (Podman writes it into /etc/hosts)."""
    hosts = kit.podman("exec", container, "cat", "/etc/hosts").stdout
    for line in hosts.splitlines():
        fields = line.split()
        if len(fields) >= 2 and "host.containers.internal" in fields[1:]:
            return fields[0]
    raise AssertionError(f"no host.containers.internal in the container's /etc/hosts:\n{hosts}")


@ENGINE_GROUP
def test_a_default_container_cannot_reach_the_hosts_loopback(
    engine: Engine, installation: str
) -> None:
    p = provider(engine, installation)
    container = started(p, engine, installation)
    with listener("127.0.0.1") as (port, token):
        seen = probe(container, port, token, "127.0.0.1", "localhost")
        assert set(seen) == {"127.0.0.1", "localhost"} and "REACHED" not in seen.values(), seen
        # Nor by the host's address on its network, or slirp4netns' and Podman's gateways.
        gateway = host_address(container)
        hosts = list(dict.fromkeys([gateway, "10.0.2.2", "10.88.0.1"]))
        seen = probe(container, port, token, *hosts)
        assert sorted(seen) == sorted(hosts) and "REACHED" not in seen.values(), seen
    assert not gateway.startswith("127.")
    inspected = kit.podman("inspect", "--format", "{{.HostConfig.NetworkMode}}", container)
    assert inspected.stdout.strip() == "bridge"
    # The way out it is meant to have: the host's own address on its network, where the
    # control plane's API and broker answer when they listen there and the worker is told so.
    with listener(gateway) as (port, token):
        assert probe(container, port, token, "host.containers.internal") == {
            "host.containers.internal": "REACHED"
        }


@ENGINE_GROUP
def test_the_host_network_is_an_explicit_opt_in_and_reaches_loopback(
    engine: Engine, installation: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The probe is no blind one: with the opt-in the loopback server answers it."""
    caplog.set_level(logging.WARNING, logger="autoscaler.providers.container")
    p = provider(engine, installation, network="host", unsafe_host_network=True)
    assert any("unsafe_host_network" in r.getMessage() for r in caplog.records)
    container = started(p, engine, installation)
    with listener("127.0.0.1") as (port, token):
        assert probe(container, port, token, "127.0.0.1") == {"127.0.0.1": "REACHED"}


def test_validate_refuses_the_host_network_and_engines_on_tcp_without_tls() -> None:
    for network in ("host", "HOST"):
        with pytest.raises(ConfigError) as info:
            validate_provider("gpu-box", "container", {"gpus": 0, "network": network})
        text = info.value.render()
        assert "providers.gpu-box.network" in text and "loopback" in text
        assert "unsafe_host_network: true" in text and "bridge" in text
    with pytest.raises(ConfigError, match="only goes with network: host"):
        validate_provider("gpu-box", "container", {"gpus": 0, "unsafe_host_network": True})
    allowed = validate_provider(
        "gpu-box", "container", {"gpus": 0, "network": "host", "unsafe_host_network": True}
    )
    assert isinstance(allowed, ContainerOptions) and allowed.network == "host"
    default = validate_provider("gpu-box", "container", {"gpus": 0})
    assert isinstance(default, ContainerOptions) and default.network == "bridge"
    for url in (
        "tcp://127.0.0.1:2375",
        "tcp://localhost:2375",
        "tcp://[::1]:2375",
        "tcp://10.1.2.3:2375",
    ):
        with pytest.raises(ConfigError) as info:
            validate_provider("gpu-box", "container", {"gpus": 0, "url": url})
        text = info.value.render()
        assert "providers.gpu-box" in text and "without TLS" in text and "loopback" in text
        assert "unix://" in text and "tls" in text
    validate_provider("gpu-box", "container", {"gpus": 0, "url": "unix:///run/podman/podman.sock"})
    # The provider holds the same rules, whatever made its config.
    for host in ("tcp://127.0.0.1:2375", "tcp://localhost:2375", "tcp://10.1.2.3:2375"):
        plain = ContainerOptions.model_validate({"kind": "container", "gpus": 0})
        with pytest.raises(ProviderRequestError, match="without verified TLS"):
            ContainerProvider("gpu-box", plain, "inst", environ={"DOCKER_HOST": host})
    built = ContainerOptions.model_construct(
        **{**ContainerOptions.model_validate({"kind": "container", "gpus": 0}).__dict__}
    )
    for field, value in (("url", "tcp://127.0.0.1:2375"), ("network", "host")):
        bad = built.model_copy(update={field: value})
        with pytest.raises(ProviderRequestError, match="loopback"):
            ContainerProvider("gpu-box", bad, "inst", environ={})
