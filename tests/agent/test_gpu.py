"""The agent's GPU reading, parsed from real nvidia-smi output (tests/agent/gpu_samples/)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from autoscaler.agent import gpu

SAMPLES = Path(__file__).parent / "gpu_samples"


def test_a_busy_h200_reads_100_percent_and_an_idle_one_0():
    busy = gpu.parse_query((SAMPLES / "busy-query-gpu-busy.csv").read_text())
    idle = gpu.parse_query((SAMPLES / "idle-query-gpu.csv").read_text())
    assert busy and all(r.name == "NVIDIA H200" and r.utilisation == 100.0 for r in busy)
    assert busy[0].memory_used_mib == 1395 and busy[0].memory_total_mib == 143771
    assert busy[0].memory_utilisation == 6
    assert len(idle) == 1 and idle[0].utilisation == 0.0 and idle[0].memory_used_mib == 0
    assert gpu.mean_utilisation(busy) == 100.0 and gpu.mean_utilisation(idle) == 0.0


@pytest.mark.parametrize(
    "output",
    [
        "",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        "Failed to initialize NVML: Driver/library version mismatch",
        (SAMPLES / "idle-plain.txt").read_text(),  # not the CSV: nothing mistaken for a GPU
        (SAMPLES / "idle-q-util-mem.txt").read_text(),
    ],
)
def test_anything_but_the_csv_is_no_gpu_data_never_an_error(output):
    assert gpu.parse_query(output) == []
    assert gpu.mean_utilisation(gpu.parse_query(output)) is None


def test_not_available_fields_and_several_gpus():
    out = (
        "0, GPU-a, NVIDIA A100, 40, 10, 100, 80000, 50, 200.0, Disabled, P0\n"
        "1, GPU-b, NVIDIA A100, [N/A], [N/A], 10, 80000, 40, [N/A], Enabled, P0\n"
        "2, GPU-c, NVIDIA A100, 80, 30, 100, 80000, 55, 210.0, Disabled, P0\n"
    )
    readings = gpu.parse_query(out)
    assert [r.index for r in readings] == [0, 1, 2]
    assert readings[1].utilisation is None  # a MIG-enabled GPU reports no utilisation
    assert gpu.mean_utilisation(readings) == 60.0


def _fake_smi(tmp_path: Path, script: str) -> dict[str, str]:
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{tmp_path}:{os.environ['PATH']}"}


def test_read_runs_nvidia_smi_and_survives_its_failures(tmp_path, monkeypatch):
    sample = SAMPLES / "busy-query-gpu-busy.csv"
    monkeypatch.setenv("PATH", _fake_smi(tmp_path, f'cat "{sample}"\n')["PATH"])
    assert gpu.mean_utilisation(gpu.read()) == 100.0
    monkeypatch.setenv(
        "PATH", _fake_smi(tmp_path, "echo 'NVIDIA-SMI has failed'; exit 9\n")["PATH"]
    )
    assert gpu.read() == []
    monkeypatch.setenv("PATH", "/nonexistent")
    assert gpu.read() == []
