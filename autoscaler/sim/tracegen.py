"""Seeded one-day traces for the cost benchmark: `python -m autoscaler.sim.tracegen [DIR]`.

- steady: Poisson arrivals, ~40 jobs/hour all day.
- diurnal: a quiet night and a daytime peak around 14:00 UTC (~260 jobs/hour at the top).
- spiky: a trickle plus ten bursts of 40-150 jobs arriving within a couple of minutes.
Runtimes are log-normal around 2-3 minutes (GPU inference/batch jobs). Same seed, same file.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable
from pathlib import Path

from autoscaler.sim.trace import Job, write_csv

DAY = 86400.0
TRACES_DIR = Path(__file__).parent / "traces"
SEEDS = {"steady": 11, "diurnal": 22, "spiky": 33}


def _runtime(rng: random.Random, median: float) -> float:
    return max(5.0, min(3600.0, rng.lognormvariate(math.log(median), 0.6)))


def _poisson(
    rng: random.Random, rate_at: Callable[[float], float], peak_rate: float
) -> list[float]:
    """Arrivals of a non-homogeneous Poisson process by thinning (rates in jobs/second)."""
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak_rate)
        if t >= DAY:
            return out
        if rng.random() * peak_rate <= rate_at(t):
            out.append(t)


def steady(seed: int = SEEDS["steady"]) -> list[Job]:
    rng = random.Random(seed)
    rate = 40 / 3600
    return [Job(a, _runtime(rng, 120)) for a in _poisson(rng, lambda t: rate, rate)]


def diurnal(seed: int = SEEDS["diurnal"]) -> list[Job]:
    rng = random.Random(seed)
    low, high = 8 / 3600, 260 / 3600

    def rate(t: float) -> float:
        # a bell around 14:00, ~4 h wide at half height
        return low + (high - low) * math.exp(-(((t - 14 * 3600) / (2.5 * 3600)) ** 2))

    return [Job(a, _runtime(rng, 150)) for a in _poisson(rng, rate, high)]


def spiky(seed: int = SEEDS["spiky"]) -> list[Job]:
    rng = random.Random(seed)
    rate = 6 / 3600
    arrivals = _poisson(rng, lambda t: rate, rate)
    for _ in range(10):
        start = rng.uniform(0, DAY - 3600)
        size = rng.randint(40, 150)
        arrivals.extend(start + rng.uniform(0, 120) for _ in range(size))
    arrivals.sort()
    return [Job(a, _runtime(rng, 90)) for a in arrivals]


GENERATORS = {"steady": steady, "diurnal": diurnal, "spiky": spiky}


def generate_all(directory: Path = TRACES_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, gen in GENERATORS.items():
        path = directory / f"{name}.csv"
        write_csv(gen(), path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in generate_all(Path(sys.argv[1]) if len(sys.argv) > 1 else TRACES_DIR):
        print(p)


# ------------------------------------------------------------------ traces not tuned on
# Generated, never written to disk; `benchmarks/cost.py --unseen` runs them. Seeds differ from
# the shipped ones so no setting was chosen by looking at them.


def sparse(seed: int = 101) -> list[Job]:
    """A 60 s job about every 11 minutes (jittered): the worst case of a fixed idle timeout."""
    rng = random.Random(seed)
    out, t = [], rng.uniform(0, 660)
    while t < DAY:
        out.append(Job(t, 60.0))
        t += rng.uniform(540, 780)
    return out


def short_burst(seed: int = 102) -> list[Job]:
    """500 jobs of about 10 s arriving within a minute, once, then a trickle."""
    rng = random.Random(seed)
    start = rng.uniform(3600, DAY - 7200)
    jobs = [Job(start + rng.uniform(0, 60), _runtime(rng, 10)) for _ in range(500)]
    jobs += [Job(a, _runtime(rng, 60)) for a in _poisson(rng, lambda t: 2 / 3600, 2 / 3600)]
    return sorted(jobs, key=lambda j: j.arrival_s)


def long_short(seed: int = 103) -> list[Job]:
    """Poisson arrivals, 80 % short (~30 s) and 20 % long (~30 min) jobs."""
    rng = random.Random(seed)
    rate = 20 / 3600
    return [
        Job(a, _runtime(rng, 30) if rng.random() < 0.8 else _runtime(rng, 1800))
        for a in _poisson(rng, lambda t: rate, rate)
    ]


def trickle(seed: int = 104) -> list[Job]:
    """~12 jobs an hour of ~90 s: a machine is mostly idle whatever the policy does."""
    rng = random.Random(seed)
    rate = 12 / 3600
    return [Job(a, _runtime(rng, 90)) for a in _poisson(rng, lambda t: rate, rate)]


def diurnal2(seed: int = 105) -> list[Job]:
    return diurnal(seed)


UNSEEN = {
    "sparse": sparse,
    "short-burst": short_burst,
    "long-short": long_short,
    "trickle": trickle,
    "diurnal-2": diurnal2,
}
