"""GPU readings for the agent's heartbeat, from `nvidia-smi`'s CSV query (tested on real output
in tests/agent/gpu_samples/). A machine with no GPU, no driver, or a driver/library mismatch
gives no reading — never an error: the heartbeat simply carries no GPU data."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from autoscaler.digits import ascii_whole

QUERY = (
    "index,uuid,name,utilization.gpu,utilization.memory,memory.used,memory.total,"
    "temperature.gpu,power.draw,mig.mode.current,pstate"
)
COMMAND = ("nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits")


@dataclass(frozen=True)
class GpuReading:
    """One GPU. Percentages and MiB as nvidia-smi prints them; None where it says [N/A]."""

    index: int
    name: str
    utilisation: float | None
    memory_utilisation: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None


def _number(text: str) -> float | None:
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]", empty
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def parse_query(output: str) -> list[GpuReading]:
    """The GPUs in the CSV `COMMAND` prints; lines that are not GPU rows (a failure message)
    are left out."""
    readings = []
    for line in output.splitlines():
        fields = [f.strip() for f in line.split(",")]
        index = ascii_whole(fields[0]) if len(fields) >= 7 else None
        if index is None:
            continue
        readings.append(
            GpuReading(
                index=index,
                name=fields[2],
                utilisation=_number(fields[3]),
                memory_utilisation=_number(fields[4]),
                memory_used_mib=_number(fields[5]),
                memory_total_mib=_number(fields[6]),
            )
        )
    return readings


def mean_utilisation(readings: Sequence[GpuReading]) -> float | None:
    """The machine's GPU utilisation: the mean over its GPUs that report one, 0-100."""
    values = [r.utilisation for r in readings if r.utilisation is not None]
    if not values:
        return None
    return max(0.0, min(100.0, sum(values) / len(values)))


def read() -> list[GpuReading]:
    """This machine's GPUs now; [] without nvidia-smi or when it fails."""
    if shutil.which(COMMAND[0]) is None:
        return []
    try:
        done = subprocess.run(COMMAND, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:
        return []
    return parse_query(done.stdout)
