"""Event sequences: random small traces replayed in the simulator through decide(), every
evaluation checked against the invariants, and the world checked at the end."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.sim.engine import Simulation
from autoscaler.sim.trace import Job

from .helpers import PROVIDERS
from .invariants import checked_decide


def sim_config(min_workers, max_workers, up, idle, fail, cap_err, sched_down):
    import yaml

    from autoscaler.config import load_config_text

    down = [{"trigger": "idle", "timeout": idle}]
    if sched_down:
        down.append({"trigger": "schedule", "cron": "*/20 * * * *"})
    doc = {
        "providers": {
            "sim": {
                "kind": "mock",
                "boot_delay": 120,
                "boot_failure_rate": fail,
                "capacity_error_rate": cap_err,
                "price_per_hour": 0.6,
            }
        },
        "backoff": {"base": 20, "cap": 120},
        "queues": {
            "q": {
                "autoscale": {
                    "provider": "sim",
                    "min_workers": min_workers,
                    "max_workers": max_workers,
                    "scale_up": up,
                    "scale_down": down,
                    "instance": {"gpu": "x", "max_price_per_hour": 0.6},
                }
            }
        },
    }
    return load_config_text(yaml.safe_dump(doc), registered_providers=PROVIDERS)


UPS = st.lists(
    st.sampled_from(
        [
            {"trigger": "no_workers"},
            {"trigger": "queue_depth", "threshold": 2},
            {"trigger": "queue_depth", "target_per_worker": 2},
            {"trigger": "latency", "max_latency": 60},
            {"trigger": "schedule", "cron": "*/30 * * * *", "workers": 1, "duration": 600},
        ]
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda d: str(d),
)

JOBS = st.lists(st.tuples(st.floats(0, 5400), st.floats(1, 900)), max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    JOBS,
    UPS,
    st.integers(0, 1),
    st.integers(1, 5),
    st.integers(30, 600),
    st.sampled_from([0.0, 0.3]),
    st.sampled_from([0.0, 0.3]),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_replayed_sequences_keep_invariants(jobs, up, mn, mx, idle, fail, cap_err, sched, seed):
    cfg = sim_config(mn, max(mn, mx), up, idle, fail, cap_err, sched)
    trace = [Job(a, r) for a, r in sorted(jobs)]
    calls = []

    def policy(snapshot, config, now):
        calls.append(now)
        return checked_decide(snapshot, config, now)

    sim = Simulation(cfg, "q", trace, policy, seed=seed, day_s=5400, tail_s=3600)
    result = sim.run()
    assert calls
    assert result.killed == 0  # no busy worker was ever destroyed
    assert result.max_over_limit <= 0  # never above max_workers, booting included
    if "no_workers" in str(up) and fail == 0 and cap_err == 0 and sum(r for _, r in jobs) < 1800:
        assert len(result.starts) == len(trace)  # every job served
