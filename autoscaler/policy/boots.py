"""What boots teach, pure: the agent's phase names, the statistics of boot times, whether a
boot was slow enough to avoid its host.

Boot times here are control-plane times only: an instance row's `created_at` (the decision
that asked for the machine) to its `ready_at` (its worker's first proof of life), both stamped
on the store's clock, over cold boots (`resumes == 0`). The phases an agent reports
(`BOOT_PHASES`) are the machine's own word and only ever shown (where the time went); no
decision reads them: a rented host is someone else's computer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

BOOT_PHASES = (
    "started",
    "registered",
    "code_fetched",
    "requirements_installed",
    "worker_up",
    "first_job",
)
"""The phases a machine's agent reports, in the order they happen: the agent started, it
registered with the API, the code is checked out at its ref, the requirements are installed
(or there was nothing to install), the worker process started, the first heartbeat that saw a
task running."""

SLOW_FACTOR = 3.0
"""A cold boot longer than this many times the median of its (provider, GPU) is slow."""

SLOW_MIN_SAMPLES = 5
"""Earlier cold boots of its (provider, GPU) needed before a boot is judged at all."""


@dataclass(frozen=True)
class BootStat:
    """Seconds from decision to ready over a set of cold boots: the median, the 90th percentile
    (nearest rank: with fewer than 10 boots it is the slowest one) and how many boots."""

    median: float
    p90: float
    samples: int

    def as_json(self) -> dict[str, float | int]:
        return {
            "median_seconds": round(self.median, 3),
            "p90_seconds": round(self.p90, 3),
            "samples": self.samples,
        }


def percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank `q`-quantile (0 < q ≤ 1) of an ascending, non-empty list."""
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median(ordered: list[float]) -> float:
    """The median of an ascending, non-empty list (the mean of the middle two for an even
    count)."""
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def boot_stat(seconds: Iterable[float]) -> BootStat | None:
    """The statistics of these boot times (negative or non-finite ones left out); None for
    none."""
    ordered = sorted(s for s in seconds if math.isfinite(s) and s >= 0)
    if not ordered:
        return None
    return BootStat(median(ordered), percentile(ordered, 0.9), len(ordered))


@dataclass(frozen=True)
class SlowBoot:
    """A cold boot judged slow: its seconds against the earlier boots of its kind."""

    seconds: float
    median: float
    samples: int
    factor: float

    def reason(self, provider: str, gpu: str | None, host: str) -> str:
        return (
            f"slow boot on host {host}: ready {self.seconds:.0f}s after its launch, more than "
            f"{self.factor:g}× the median {self.median:.0f}s of the last {self.samples} cold "
            f"boot(s) of {gpu or 'its GPU'} on {provider}"
        )


def judge_boot(
    seconds: float,
    earlier: Iterable[float],
    factor: float = SLOW_FACTOR,
    min_samples: int = SLOW_MIN_SAMPLES,
) -> SlowBoot | None:
    """The verdict on one cold boot of `seconds` against the `earlier` cold boots of the same
    (provider, GPU): slow when there are at least `min_samples` of them and it took more than
    `factor` × their median; None otherwise (too few to judge, or not slow)."""
    stat = boot_stat(earlier)
    if stat is None or stat.samples < min_samples or stat.median <= 0:
        return None
    if not math.isfinite(seconds):
        return None
    if seconds > factor * stat.median:
        return SlowBoot(seconds, stat.median, stat.samples, factor)
    return None


__all__ = [
    "BOOT_PHASES",
    "SLOW_FACTOR",
    "SLOW_MIN_SAMPLES",
    "BootStat",
    "SlowBoot",
    "boot_stat",
    "judge_boot",
    "median",
    "percentile",
]
