"""Two references beside the lower bound, computed from the trace alone (no policy runs).

- Zero-wait oracle: a clairvoyant schedule that starts every job the moment it arrives, on
  machines rented a boot time ahead. A machine freed at f serves a job arriving at a only if
  a − f is below a boot time (keeping it idle is then cheaper than renting anew); among the
  machines it could reuse it takes the one freed last (latest-freed first, a greedy for the
  assignment problem of jobs to machines). It pays every boot, every idle gap it keeps and
  every rental's fixed cost: what serving the trace with no wait at all costs. It ignores
  max_workers (see the wait floor for that).
- Wait floor: FIFO on max_workers machines that are always up and warm (no boot, no scale-in):
  no policy under that cap can make jobs wait less. Its cost is not a reference (it pays for
  the cap all day), only its waits are.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

from autoscaler.sim.report import percentile
from autoscaler.sim.trace import Job


@dataclass(frozen=True)
class Oracle:
    machine_hours: float
    dollars: float
    rentals: int
    peak_machines: int


def zero_wait_oracle(
    jobs: list[Job],
    boot_s: float,
    price_per_hour: float,
    per_rental_dollars: float = 0.0,
    concurrency: int = 1,
) -> Oracle:
    order = sorted(jobs, key=lambda j: j.arrival_s)
    busy: list[tuple[float, int]] = []  # (free at, machine) of slots running a job
    free: list[tuple[float, int]] = []  # ascending (freed at, machine) of free slots
    rented_at: dict[int, float] = {}
    last_end: dict[int, float] = {}
    running: dict[int, int] = {}
    active = peak = 0
    for job in order:
        a = job.arrival_s
        while busy and busy[0][0] <= a:
            f, mid = heapq.heappop(busy)
            running[mid] -= 1
            active -= running[mid] == 0
            bisect.insort(free, (f, mid))
        # slots freed more than a boot time ago: renting anew is cheaper than keeping them
        cut = bisect.bisect_left(free, (a - boot_s, -1))
        del free[:cut]
        if free:
            _, mid = free.pop()
        else:
            mid = len(rented_at)
            rented_at[mid] = a - boot_s
            running[mid] = 0
            # a new machine brings `concurrency` slots; the spare ones are free from its start
            for _ in range(concurrency - 1):
                bisect.insort(free, (a, mid))
        active += running[mid] == 0
        running[mid] += 1
        peak = max(peak, active)
        end = a + job.runtime_s
        last_end[mid] = max(last_end.get(mid, end), end)
        heapq.heappush(busy, (end, mid))
    seconds = sum(last_end[m] - rented_at[m] for m in rented_at)
    hours = seconds / 3600.0
    return Oracle(
        hours, hours * price_per_hour + len(rented_at) * per_rental_dollars, len(rented_at), peak
    )


@dataclass(frozen=True)
class WaitFloor:
    p50: float
    p95: float
    p99: float
    max: float


def wait_floor(jobs: list[Job], max_workers: int, concurrency: int = 1) -> WaitFloor:
    slots = [0.0] * max(1, max_workers * concurrency)
    heapq.heapify(slots)
    waits = []
    for job in sorted(jobs, key=lambda j: j.arrival_s):
        free_at = heapq.heappop(slots)
        start = max(job.arrival_s, free_at)
        waits.append(start - job.arrival_s)
        heapq.heappush(slots, start + job.runtime_s)
    waits.sort()
    return WaitFloor(
        percentile(waits, 50),
        percentile(waits, 95),
        percentile(waits, 99),
        waits[-1] if waits else 0.0,
    )
