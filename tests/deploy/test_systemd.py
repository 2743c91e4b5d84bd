"""deploy/systemd units: `systemd-analyze verify` where it exists (a unit's binaries are not
installed here: only that complaint is allowed), and in every case a parse of each unit."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = sorted((Path(__file__).resolve().parents[2] / "deploy" / "systemd").glob("*.service"))


def parse(path: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(path.read_text())
    return cp


def test_the_units_are_there():
    names = {p.name for p in UNITS}
    assert {
        "autoscaler-migrate.service",
        "autoscaler-api.service",
        "autoscaler-beat.service",
        "autoscaler-worker@.service",
        "autoscaler-lifecycle@.service",
        "autoscaler-flower.service",
    } <= names
    # the loop's workers and the lifecycle's consume their own queue each
    for unit, queue in (("worker", "autoscaler"), ("lifecycle", "autoscaler.lifecycle")):
        argv = parse(UNITS[0].parent / f"autoscaler-{unit}@.service")["Service"]["ExecStart"]
        words = argv.split()
        assert words[words.index("-Q") + 1] == queue, unit


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_shape(unit):
    cp = parse(unit)
    assert {"Unit", "Service", "Install"} <= set(cp.sections())
    svc = cp["Service"]
    assert svc["ExecStart"].startswith("/opt/autoscaler/.venv/bin/")
    assert svc["User"] == "autoscaler"
    assert svc["EnvironmentFile"] == "/etc/autoscaler/autoscaler.env"
    assert svc["LoadCredential"] == "vault_key:/etc/autoscaler/vault.key"
    assert svc["NoNewPrivileges"] == "yes"
    assert "PASSWORD" not in unit.read_text().upper().replace("FLOWER_BASIC_AUTH", "")
    if unit.name != "autoscaler-migrate.service" and unit.name != "autoscaler-flower.service":
        assert "autoscaler-migrate.service" in cp["Unit"]["Requires"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_systemd_analyze_verify(unit, tmp_path):
    res = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    other = [
        line
        for line in (res.stdout + res.stderr).splitlines()
        if line.strip() and "is not executable" not in line
    ]
    assert other == []
