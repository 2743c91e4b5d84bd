"""The images under test: built once per run by `scripts/images.sh --build-only` (which skips
what is up to date), and the containers each test starts, removed at its end.

Nothing here skips: a machine without a container engine fails these tests, with the reason
(`scripts/images.sh` installs podman where it can)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.containers.engine import REPO, podman, podman_env
from tests.images.kit import IMAGES, Images


@pytest.fixture(scope="session")
def images() -> Images:
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "images.sh"), "--build-only"],
        env=podman_env(),
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert done.returncode == 0, f"scripts/images.sh failed:\n{done.stdout}\n{done.stderr}"
    return IMAGES


@pytest.fixture
def containers() -> Iterator[list[str]]:
    """Names of the containers a test starts (append them); each is removed at the end."""
    names: list[str] = []
    try:
        yield names
    finally:
        for name in names:
            podman("rm", "--force", "--time", "2", name, check=False)
