"""The import-linter contracts in pyproject.toml hold on the code, and each one fails on a
deliberate wrong import: a copy of the package gets one bad line, and `lint-imports` must name
the contract it breaks (and only then exit non-zero).

scripts/test.sh runs `lint-imports` on the real tree beside ruff and mypy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = str(Path(sys.executable).parent / "lint-imports")

LAYERS = "Layers: entry points on top"
SQL = "SQL is written in store/ alone"
PURE = "The policy is pure"
ROWS = "The ORM models stay in store/"
TRANSPORTS = "Each broker transport stands alone"


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LINT, "--no-cache"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},  # the copy, not the installed package
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "autoscaler", tmp_path / "autoscaler", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_contracts_hold_on_the_code(tree):
    out = _lint(tree)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in (LAYERS, SQL, PURE, ROWS, TRANSPORTS):
        assert f"{name}" in out.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        # the pure core reaching up to the lifecycle
        ("autoscaler/policy/decide.py", "import autoscaler.control.tick.evaluate", LAYERS),
        # the lifecycle reaching up to the HTTP server
        ("autoscaler/control/steps/launch.py", "import autoscaler.api.app", LAYERS),
        # the store reaching up to the providers or the brokers (it implements the readers'
        # `Sightings` port, whose types live in the store)
        ("autoscaler/store/moves.py", "import autoscaler.providers.registry", LAYERS),
        ("autoscaler/store/head_sightings.py", "import autoscaler.brokers.registry", LAYERS),
        # one broker transport reaching into another
        (
            "autoscaler/brokers/asynq/asynq.py",
            "import autoscaler.brokers.lists.redis_list",
            TRANSPORTS,
        ),
        (
            "autoscaler/brokers/rabbitmq/users.py",
            "import autoscaler.brokers.redis.layout",
            TRANSPORTS,
        ),
        # SQL written in the lifecycle, the API, the dashboard
        ("autoscaler/control/tick/evaluate.py", "from sqlalchemy import select", SQL),
        ("autoscaler/api/app.py", "from sqlalchemy import update", SQL),
        # an ORM row named outside the store: the lifecycle, the API, the dashboard
        ("autoscaler/control/steps/drain.py", "from autoscaler.store.models import Instance", ROWS),
        ("autoscaler/api/deps.py", "from autoscaler.store.models import Instance", ROWS),
        ("autoscaler/dashboard/documents.py", "from autoscaler.store import models", ROWS),
        # the agent-server messages reaching into config (a sibling), the store or the API:
        # wire stays beneath both the agent and the API
        ("autoscaler/wire.py", "import autoscaler.config", LAYERS),
        ("autoscaler/wire.py", "import autoscaler.store.db", LAYERS),
        ("autoscaler/wire.py", "import autoscaler.api.machines", LAYERS),
        # the policy talking to a broker or a database
        ("autoscaler/policy/reconcile.py", "import redis", PURE),
        ("autoscaler/policy/history.py", "import sqlalchemy", PURE),
    ],
)
def test_each_contract_fails_on_a_wrong_import(tree, module, line, contract):
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}  # a deliberate wrong arrow\n")
    out = _lint(tree)
    assert out.returncode != 0
    broken = out.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken and module.removesuffix(".py").replace("/", ".") in broken, out.stdout
