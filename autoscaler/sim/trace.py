"""Job traces: CSV (`arrival_s,runtime_s[,queue]`, header required) or JSON Lines."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Job:
    arrival_s: float
    runtime_s: float
    queue: str | None = None


class TraceError(ValueError):
    """A trace that cannot be replayed, with the line and the fix."""


def _job(arrival: object, runtime: object, queue: object, where: str) -> Job:
    try:
        a = float(arrival)  # type: ignore[arg-type]
        r = float(runtime)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TraceError(
            f"{where}: arrival_s and runtime_s must be numbers (got {arrival!r}, {runtime!r})"
        ) from None
    if not (math.isfinite(a) and math.isfinite(r)) or a < 0 or r < 0:
        raise TraceError(f"{where}: arrival_s and runtime_s must be finite and ≥ 0")
    q = str(queue) if queue not in (None, "") else None
    return Job(a, r, q)


def load_trace(path: str | Path) -> list[Job]:
    """Jobs sorted by arrival. `.jsonl`/`.json` files are JSON Lines, anything else CSV."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    jobs: list[Job] = []
    if p.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{p}:{n}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise TraceError(f"{p}:{n}: each line must be an object with arrival_s, runtime_s")
            jobs.append(
                _job(row.get("arrival_s"), row.get("runtime_s"), row.get("queue"), f"{p}:{n}")
            )
    else:
        reader = csv.DictReader(text.splitlines())
        fields = reader.fieldnames or []
        if "arrival_s" not in fields or "runtime_s" not in fields:
            raise TraceError(f"{p}: the CSV header must name arrival_s and runtime_s")
        for n, row in enumerate(reader, 2):
            jobs.append(_job(row["arrival_s"], row["runtime_s"], row.get("queue"), f"{p}:{n}"))
    jobs.sort(key=lambda j: j.arrival_s)
    return jobs


def write_csv(jobs: list[Job], path: str | Path) -> None:
    with Path(path).open("w", encoding="utf-8", newline="") as fh:
        fh.write("arrival_s,runtime_s\n")
        for j in jobs:
            fh.write(f"{j.arrival_s:.1f},{j.runtime_s:.1f}\n")
