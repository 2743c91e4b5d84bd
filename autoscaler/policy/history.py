"""What a queue's own past says about its traffic, and the rules that use it.

The shell keeps a `QueueHistory` per queue (the loop in `queue_status`, the simulator in memory)
and updates it with `observe_load` from each reading, before `decide()` sees it:

- quiet gaps: from the moment nothing was pending or running to the next job, as the readings
  saw them (a poll's resolution). They say how long an idle machine would have waited for work.
- job seconds: the mean runtime of the queue's jobs finished in the last day, as the workers
  reported them (the agent's hook); None where no worker reports jobs.

Everything here is pure: the same numbers give the same answer in the loop and the simulator.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import lru_cache

# what the config promises of a learned timeout (how few gaps teach nothing, how far it goes)
from autoscaler.config.triggers import LEARNED_MAX_FACTOR, MIN_GAPS

GAPS_KEPT = 64
"""The last this many quiet gaps are kept: about a day of a sparse queue, enough for a
distribution, short enough to follow a change of traffic within a day."""


@dataclass(frozen=True)
class QueueHistory:
    """A queue's traffic as the loop saw it: recent quiet gaps (seconds, oldest first), when
    the current quiet period began (None while busy or never quiet), and the mean runtime of
    its recently finished jobs (None until a worker reported one)."""

    quiet_gaps: tuple[float, ...] = ()
    quiet_since: datetime | None = None
    job_seconds: float | None = None
    jobs_seen: int = 0


NO_HISTORY = QueueHistory()


def observe_load(history: QueueHistory, load: int, now: datetime) -> QueueHistory:
    """The history after a reading of `load` jobs (pending + running) at `now`.

    A quiet period starts at the first reading with no load and ends, as one gap, at the first
    reading with load again. A reading older than the quiet start (out of order) changes nothing."""
    if load <= 0:
        return history if history.quiet_since is not None else replace(history, quiet_since=now)
    if history.quiet_since is None or now < history.quiet_since:
        return history
    gap = (now - history.quiet_since).total_seconds()
    gaps = (*history.quiet_gaps, gap)[-GAPS_KEPT:]
    return replace(history, quiet_gaps=gaps, quiet_since=None)


def median(values: Sequence[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def learned_idle_timeout(
    gaps: Sequence[float], boot_s: float, configured: float
) -> tuple[float, str] | None:
    """The idle timeout that would have cost least over the observed gaps, or None (too few).

    A machine that goes idle either waits for the next job (billing the gap) or is destroyed
    after T and rented again (billing T plus a boot). Over the gaps seen, the T minimising
    Σ (g if g ≤ T else T + boot) is the ski-rental rule on the queue's own distribution; it is
    kept within [0, LEARNED_MAX_FACTOR × configured] and is the configured timeout when that
    costs the same. Returns (timeout, why). Pure and cached: decide() asks every evaluation."""
    if len(gaps) < MIN_GAPS:
        return None
    return _learned(tuple(gaps), float(boot_s), float(configured))


@lru_cache(maxsize=4096)
def _learned(gaps: tuple[float, ...], boot_s: float, configured: float) -> tuple[float, str]:
    cap = configured * LEARNED_MAX_FACTOR
    ordered = sorted(gaps)
    prefix = [0.0, *itertools.accumulate(ordered)]
    n = len(ordered)

    def cost(t: float) -> float:
        """Σ g over the gaps a machine kept for T waits through, T + boot for the others."""
        k = bisect.bisect_right(ordered, t)
        return prefix[k] + (n - k) * (t + boot_s)

    candidates = sorted({0.0, configured, cap, *(g for g in ordered if g <= cap)})
    best = min(candidates, key=lambda t: (round(cost(t), 6), abs(t - configured)))
    if math.isclose(cost(best), cost(configured)):
        best = configured
    saved = cost(configured) - cost(best)
    why = (
        f"learned from {n} gaps (median {median(ordered) or 0:.0f}s, boot {boot_s:.0f}s): "
        f"{saved:.0f} machine-seconds less than the configured {configured:.0f}s over them"
    )
    return best, why


MIN_JOBS = 20
"""The burst rule waits for this many finished jobs before it trusts the mean runtime."""


def burst_limit(
    pending: int,
    oldest_age: float | None,
    serving: int,
    booting_ages: Sequence[float],
    job_seconds: float | None,
    jobs_seen: int,
    boot_s: float,
) -> tuple[int, str] | None:
    """How many new machines the waiting jobs can use, by Little's law, or None (no limit).

    Machines serving now start the pending jobs at `serving / job_seconds` per second, and a
    machine still booting joins once its boot estimate has passed. A new machine is ready only
    after `boot_s`: the work still waiting then, `pending × job_seconds` less what the fleet gets
    through by then, is all it can take. Each new machine must find at least a boot's worth of
    that work (else it bills a boot to save less): at most ceil(left / boot_s) machines, none
    when the fleet starts every waiting job before a new one could boot.

    A busy serving machine counts as free: its current job's end is not known, and counting it
    as half a job away (boot − runtime/2) or a whole one (boot − runtime) undid the rule's
    saving and let keda be cheaper and faster on the diurnal days of the realistic world. Where
    that is wrong (hour-long jobs running, a short mean), the escape below bounds the cost: the
    oldest job waits at most a boot and a mean runtime longer than it would have.

    No limit (None) without a trustworthy runtime (fewer than MIN_JOBS finished, or none), with
    nothing serving, with instant boots, without a known age of the oldest job, or once that job
    has waited longer than a boot and a job (the estimate was wrong: capacity is then added as
    the triggers ask)."""
    if job_seconds is None or jobs_seen < MIN_JOBS or job_seconds <= 0 or serving <= 0:
        return None
    if boot_s <= 0:
        return None  # a machine that is ready at once is never too late for the work
    if pending <= 0 or oldest_age is None or oldest_age > boot_s + job_seconds:
        return None
    through = serving * boot_s + sum(
        max(0.0, boot_s - max(0.0, boot_s - age)) for age in booting_ages
    )
    left = pending * job_seconds - through
    ratio = left / boot_s  # a boot of a few microseconds makes it infinite: no limit below pending
    allowed = 0 if left <= 0 else (math.ceil(ratio) if math.isfinite(ratio) else pending)
    why = (
        f"burst: {pending} pending × {job_seconds:.0f}s mean runtime = "
        f"{pending * job_seconds:.0f}s of work; the {serving} serving"
        + (f" and {len(booting_ages)} booting" if booting_ages else "")
        + f" machine(s) get through {through:.0f}s of it in the {boot_s:.0f}s a new one takes "
        f"to boot → at most {allowed} new"
    )
    return allowed, why
