"""Shared fixtures: real PostgreSQL and SQLite databases, one fresh database per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.store.db import make_engine, session_factory
from autoscaler.store.models import Base

PG_ADMIN_DSN = os.environ.get(
    "TEST_PG_ADMIN_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
)
PG_URL_TEMPLATE = os.environ.get(
    "TEST_PG_URL_TEMPLATE", "postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
)
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379")
AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")

# Tests that drive the one container engine of this machine (podman's storage and its images)
# run on one xdist worker, one after another; every other module is its own group.
SHARED_ENGINE = (
    "tests/images/",
    "tests/containers/",
    "tests/providers/test_container.py",
    "tests/providers/test_contract.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Group tests for `pytest -n N --dist loadgroup` (scripts/test.sh): a module's tests share its
    fixtures and run on one worker, and the container engine's tests never run side by side."""
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        group = "container-engine" if path.startswith(SHARED_ENGINE) else path
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A new, empty PostgreSQL database for this test alone; dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_URL_TEMPLATE.format(db=name)
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'state.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    """Each test using this runs on both databases the product supports."""
    fixture = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    Base.metadata.create_all(eng)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)
