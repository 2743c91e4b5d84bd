"""Fixtures for the provider tests: the fakes on loopback and providers pointed at them, and a
real Podman engine for the container provider.

Retries and lookups are tuned short (milliseconds) so failure modes run fast; the logic is the
production logic. Every fake fails the test at teardown if it saw a request or sent a response
that its OpenAPI spec refuses, unless the test took those violations itself.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.config.provider_options import ContainerOptions, RunPodOptions, VastOptions
from autoscaler.providers.container import ContainerProvider
from autoscaler.providers.http import RetryPolicy
from autoscaler.providers.runpod import RunPodProvider
from autoscaler.providers.vast import VastProvider
from autoscaler.store.avoided_hosts import StoredHostsToAvoid
from autoscaler.store.db import make_engine, session_factory
from autoscaler.store.models import Base
from tests.containers import engine as podman_kit
from tests.fakes.runpod_server import FakeRunPod
from tests.fakes.vast_server import FakeVast

SECRET = "rpa_SUPERSECRET_4f9c2e7b1d_do_not_log"
VAST_SECRET = "vast_SUPERSECRET_8e1a5c0f3b_do_not_log"
INSTALLATION = "inst0a1b2c3d"
OTHER_INSTALLATION = "othr9z8y7x6w"
FAST = RetryPolicy(attempts=4, base=0.01, cap=0.05, rate_limit_budget=0.2)
TIMEOUT = (1.0, 0.3)  # connect, read: a fake holding a create 0.6 s is a timeout


@pytest.fixture(scope="session")
def podman_engine() -> Iterator[podman_kit.Engine]:
    """A real Podman engine (its API on a socket of this session's) and the test image
    (`tests/containers/engine.py`). Never skipped: without podman these fail, saying so
    (`scripts/images.sh` installs it)."""
    with podman_kit.podman_engine() as engine:
        yield engine


@pytest.fixture
def installations() -> Iterator[Callable[[], str]]:
    """Fresh installation ids (the engine's storage is shared by every test run on this
    machine); every container labelled for one of them is removed at teardown."""
    made: list[str] = []

    def fresh() -> str:
        made.append(f"t{uuid.uuid4().hex[:15]}")
        return made[-1]

    try:
        yield fresh
    finally:
        for installation in made:
            podman_kit.remove_owned_by(installation)


def make_container(
    engine: podman_kit.Engine,
    installation: str,
    *,
    grace: float = 1.0,
    **cfg: object,
) -> ContainerProvider:
    """The container provider on the test engine; containers sleep unless `command` says."""
    options: dict[str, object] = {
        "kind": "container",
        "url": engine.url,
        "gpus": 0,
        "command": ["sleep", "infinity"],
        "price_per_hour": 0.30,
    }
    options.update(cfg)
    config = ContainerOptions.model_validate(options)
    return ContainerProvider(
        "gpu-box", config, installation, timeout=30.0, grace=grace, lookup_delay=0.05
    )


def spec(**kw: object) -> InstanceSpec:
    base: dict[str, object] = {
        "gpu": "RTX 4090",
        "disk_gb": 50,
        "max_price_per_hour": 0.60,
        "image": "ghcr.io/acme/worker:1",
    }
    base.update(kw)
    return InstanceSpec.model_validate(base)


@pytest.fixture
def fake_runpod() -> Iterator[FakeRunPod]:
    fake = FakeRunPod(SECRET)
    try:
        yield fake
    finally:
        fake.close()
    assert fake.spec_violations == [], fake.spec_violations


@pytest.fixture
def fake_vast() -> Iterator[FakeVast]:
    fake = FakeVast(VAST_SECRET)
    try:
        yield fake
    finally:
        fake.close()
    assert fake.spec_violations == [], fake.spec_violations


def make_runpod(
    fake: FakeRunPod, key: str = SECRET, installation: str = INSTALLATION, **cfg: object
) -> RunPodProvider:
    config = RunPodOptions.model_validate({"kind": "runpod", "base_url": fake.url, **cfg})
    return RunPodProvider(
        "gpu-runpod",
        config,
        key,
        installation,
        timeout=TIMEOUT,
        retry=FAST,
        lookup_attempts=3,
        lookup_delay=0.05,
    )


@pytest.fixture
def sqlite_sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(f"sqlite:///{tmp_path / 'providers.db'}")
    Base.metadata.create_all(engine)
    try:
        yield session_factory(engine)
    finally:
        engine.dispose()


def make_vast(
    fake: FakeVast,
    sessions: sessionmaker[Session],
    key: str = VAST_SECRET,
    installation: str = INSTALLATION,
    clock: object = None,
    **cfg: object,
) -> VastProvider:
    config = VastOptions.model_validate({"kind": "vast", "base_url": fake.url, **cfg})
    return VastProvider(
        "gpu-vast",
        config,
        key,
        installation,
        StoredHostsToAvoid(sessions),
        timeout=TIMEOUT,
        retry=FAST,
        lookup_attempts=3,
        lookup_delay=0.05,
        clock=clock,  # type: ignore[arg-type]
    )


@pytest.fixture
def all_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Capture everything, down to urllib3's and requests' debug lines."""
    caplog.set_level(logging.DEBUG)
    return caplog


def assert_no_secret(caplog: pytest.LogCaptureFixture, *objects: object, secret: str) -> None:
    for record in caplog.records:
        assert secret not in record.getMessage(), record.getMessage()
        assert secret not in str(record.args)
    for obj in objects:
        assert secret not in str(obj)
        assert secret not in repr(obj)
