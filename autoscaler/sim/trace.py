"""Job traces: CSV (`arrival_s,runtime_s[,queue]`, header required) or JSON Lines.

Read with limits: a regular file of at most MAX_TRACE_BYTES, UTF-8, at most MAX_JOBS jobs,
arrivals within MAX_ARRIVAL_S and runtimes within MAX_RUNTIME_S; anything else is a
TraceError naming the line and the fix.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

from autoscaler.textfile import TextFileError, read_text

MAX_TRACE_BYTES = 64 * 1024 * 1024
MAX_JOBS = 1_000_000
MAX_ARRIVAL_S = 366 * 86400.0
"""A trace covers at most a year."""
MAX_RUNTIME_S = 31 * 86400.0
MAX_LINE = 64 * 1024
"""A CSV field or a JSON line is at most 64 KiB (a job is a few dozen bytes)."""


@dataclass(frozen=True)
class Job:
    arrival_s: float
    runtime_s: float
    queue: str | None = None


class TraceError(ValueError):
    """A trace that cannot be replayed, with the line and the fix."""


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(value)
    if isinstance(value, int) and abs(value) > 10**15:
        return math.inf
    if isinstance(value, str) and len(value) > 40:
        raise ValueError(value)
    return float(value)


def _job(arrival: object, runtime: object, queue: object, where: str) -> Job:
    try:
        a = _number(arrival)
        r = _number(runtime)
    except (TypeError, ValueError, OverflowError):
        shown = [repr(v) if len(repr(v)) <= 40 else repr(v)[:38] + "…" for v in (arrival, runtime)]
        raise TraceError(
            f"{where}: arrival_s and runtime_s must be numbers (got {shown[0]}, {shown[1]})"
        ) from None
    if not (math.isfinite(a) and math.isfinite(r)) or a < 0 or r < 0:
        raise TraceError(f"{where}: arrival_s and runtime_s must be finite and ≥ 0")
    if a > MAX_ARRIVAL_S:
        raise TraceError(
            f"{where}: arrival_s {a:g} is more than a year ({MAX_ARRIVAL_S:.0f} s) after the "
            "start; a trace covers at most a year: shorten it"
        )
    if r > MAX_RUNTIME_S:
        raise TraceError(
            f"{where}: runtime_s {r:g} is more than 31 days ({MAX_RUNTIME_S:.0f} s); split "
            "the job or shorten it"
        )
    if queue in (None, ""):
        q = None
    elif isinstance(queue, str) and len(queue) <= 200 and queue.isprintable():
        q = queue
    else:
        raise TraceError(f"{where}: queue must be a queue name (printable, up to 200 characters)")
    return Job(a, r, q)


def _too_many(p: Path) -> TraceError:
    return TraceError(f"{p}: more than {MAX_JOBS:,} jobs; replay a shorter trace")


def load_trace(path: str | Path) -> list[Job]:
    """Jobs sorted by arrival. `.jsonl`/`.json` files are JSON Lines, anything else CSV."""
    p = Path(path)
    try:
        text = read_text(p, limit=MAX_TRACE_BYTES, what="a trace")
    except TextFileError as exc:
        raise TraceError(f"{exc.path}: {exc.cause}; {exc.fix}") from None
    jobs: list[Job] = []
    if p.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            if len(line) > MAX_LINE:
                raise TraceError(f"{p}:{n}: the line is longer than {MAX_LINE} characters")
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{p}:{n}: not JSON ({exc.msg})") from None
            except RecursionError:
                raise TraceError(f"{p}:{n}: nested too deeply; a line is a flat object") from None
            except ValueError as exc:  # e.g. an integer of thousands of digits
                raise TraceError(f"{p}:{n}: not readable JSON ({str(exc)[:80]})") from None
            if not isinstance(row, dict):
                raise TraceError(f"{p}:{n}: each line must be an object with arrival_s, runtime_s")
            if len(jobs) >= MAX_JOBS:
                raise _too_many(p)
            jobs.append(
                _job(row.get("arrival_s"), row.get("runtime_s"), row.get("queue"), f"{p}:{n}")
            )
    else:
        reader = csv.DictReader(text.splitlines())
        try:
            fields = reader.fieldnames or []
            if "arrival_s" not in fields or "runtime_s" not in fields:
                raise TraceError(f"{p}: the CSV header must name arrival_s and runtime_s")
            for n, row in enumerate(reader, 2):
                if len(jobs) >= MAX_JOBS:
                    raise _too_many(p)
                jobs.append(_job(row["arrival_s"], row["runtime_s"], row.get("queue"), f"{p}:{n}"))
        except csv.Error as exc:
            raise TraceError(f"{p}:{reader.line_num}: not readable CSV ({exc})") from None
    jobs.sort(key=lambda j: j.arrival_s)
    return jobs


def write_csv(jobs: list[Job], path: str | Path) -> None:
    with Path(path).open("w", encoding="utf-8", newline="") as fh:
        fh.write("arrival_s,runtime_s\n")
        for j in jobs:
            fh.write(f"{j.arrival_s:.1f},{j.runtime_s:.1f}\n")
