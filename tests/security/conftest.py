"""The API tests' small world (tests/api/apikit), on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.api.apikit import World, make_world


@pytest.fixture
def world(db_url, tmp_path) -> Iterator[World]:
    w = make_world(db_url, tmp_path)
    try:
        yield w
    finally:
        w.close()
