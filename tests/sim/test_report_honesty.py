"""The simulator's figures cannot flatter a policy: dropped work is paid for, the cap is named."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.config.models import Config
from autoscaler.policy.plan import Drain, Launch, Plan, QueuePlan
from autoscaler.policy.snapshot import Snapshot
from autoscaler.sim.cli import simulate
from autoscaler.sim.engine import Policy, Simulation
from autoscaler.sim.report import summarize
from autoscaler.sim.run import POLICIES, compare, jobs_for, load_sim_config, pick_queue
from autoscaler.sim.trace import Job, load_trace, write_csv
from autoscaler.sim.tracegen import TRACES_DIR

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def write_config(tmp_path: Path, **auto) -> Path:
    block = {
        "provider": "sim",
        "min_workers": 0,
        "max_workers": 4,
        "scale_up": [{"trigger": "no_workers"}, {"trigger": "queue_depth", "threshold": 0}],
        "scale_down": [{"trigger": "idle", "timeout": "5m"}],
        "instance": {"gpu": "x", "max_price_per_hour": 0.6},
    }
    block.update(auto)
    doc = {
        "providers": {"sim": {"kind": "mock", "boot_delay": 60, "price_per_hour": 0.6}},
        "queues": {"q": {"autoscale": block}},
    }
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def never_rents(snapshot: Snapshot, config: Config, now: datetime) -> Plan:
    return Plan(at=now)


class Dropper:
    """Rents one machine when work waits, then every third evaluation destroys every machine,
    busy or not: its jobs are killed, some never finish."""

    name = "dropper"

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, snapshot: Snapshot, config: Config, now: datetime) -> Plan:
        self.n += 1
        qs = snapshot.queues[0]
        assert qs.metrics is not None
        live = [m for m in qs.machines if m.billing]
        launches: tuple[Launch, ...] = ()
        drains: tuple[Drain, ...] = ()
        if self.n % 3 == 0:
            drains = tuple(Drain(qs.name, m.launch_id, "baseline", "drop") for m in live)
        elif qs.metrics.pending and not live:
            launches = (Launch(qs.name, "sim", "dropper", "work waits"),)
        return Plan(
            at=now,
            queues=(QueuePlan(qs.name, len(live), 0, 4, 1, launches=launches, drains=drains),),
        )


def run(config: Config, jobs: list[Job], policy: Policy, **kw) -> Simulation:
    return Simulation(config, "q", jobs, policy, name="test", **kw)


# ------------------------------------------------------------------ dropped work


def test_a_policy_that_serves_nothing_scores_the_lower_bound_not_zero(tmp_path):
    config = load_sim_config(write_config(tmp_path))
    jobs = [Job(100.0, 600.0), Job(200.0, 600.0), Job(300.0, 1200.0)]
    result = run(config, jobs, never_rents).run()
    r = summarize(result)
    assert r.never_served == 3 and r.dollars == 0
    assert r.undone_hours == pytest.approx(2400 / 3600)
    assert r.ratio == pytest.approx(1.0)
    # a job never served waited at least until the run ended: its wait is that lower bound
    assert r.wait_p50 == pytest.approx(result.end_s - 200.0)
    assert r.wait_max == pytest.approx(result.end_s - 100.0)


def test_a_job_still_running_at_the_end_counts_its_unfinished_part_as_undone(tmp_path):
    config = load_sim_config(write_config(tmp_path))
    # ten hours of work in a one-hour run (plus a one-hour tail)
    result = run(config, [Job(0.0, 36000.0)], POLICIES["ours"][0](), day_s=3600, tail_s=3600)
    r = summarize(result.run())
    assert r.never_served == 0
    assert 0 < r.undone_hours < 10
    assert r.ratio >= 1.0
    assert r.lower_bound_dollars == pytest.approx(10 * 0.6)


def test_killed_jobs_wait_until_their_last_start_and_their_lost_work_is_paid(tmp_path):
    config = load_sim_config(write_config(tmp_path))
    jobs = [Job(float(i * 10), 200.0) for i in range(6)]
    r = summarize(run(config, jobs, Dropper()).run())
    assert r.killed > 0
    assert r.ratio >= 1.0


def test_keda_like_on_the_full_example_llm_queue_scores_no_better_than_the_bound():
    # It used to score 0.99: it left jobs unserved and the bound still counted their work.
    config = load_sim_config(EXAMPLES / "full.yaml")  # what `autoscaler simulate` reads
    name = pick_queue(config, "llm")
    reports, _ = compare(config, name, jobs_for(load_trace(TRACES_DIR / "diurnal.csv"), name, name))
    for r in reports:
        assert r.ratio >= 1.0, (r.policy, r.ratio)
        assert r.never_served == 0 or r.wait_max > 3600


jobs_strategy = st.lists(
    st.builds(
        Job,
        st.floats(min_value=0, max_value=3000, allow_nan=False),
        st.floats(min_value=0, max_value=5000, allow_nan=False),
    ),
    min_size=1,
    max_size=12,
).map(lambda jobs: sorted(jobs, key=lambda j: j.arrival_s))

POLICY_FACTORIES = {
    **{name: factory for name, (factory, _) in POLICIES.items()},
    "never-rents": lambda: never_rents,
    "dropper": Dropper,
}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(jobs=jobs_strategy, policy=st.sampled_from(sorted(POLICY_FACTORIES)), seed=st.integers(0, 9))
def test_no_policy_scores_below_the_lower_bound_on_any_trace(tmp_path, jobs, policy, seed):
    config = load_sim_config(write_config(tmp_path, max_workers=2))
    sim = run(config, jobs, POLICY_FACTORIES[policy](), seed=seed, day_s=1800, tail_s=1800)
    r = summarize(sim.run())
    if r.lower_bound_dollars > 0:
        assert r.ratio >= 1.0 - 1e-9, (policy, r)
    # every job has a wait: never-served ones count up to the end of the run
    assert r.wait_max >= 0
    if r.never_served:
        assert r.wait_max > 0


# ------------------------------------------------------------------ saturation


def _burst(tmp_path: Path) -> tuple[Path, Path]:
    trace = tmp_path / "burst.csv"
    write_csv([Job(float(i), 600.0) for i in range(40)], trace)
    return trace, write_config(tmp_path, max_workers=1)


def test_a_queue_held_at_max_workers_is_flagged_for_every_policy(tmp_path):
    trace, path = _burst(tmp_path)
    config = load_sim_config(path)
    reports, _ = compare(config, "q", load_trace(trace))
    for r in reports:
        assert r.saturated, r
        assert 0.5 < r.saturated_share <= 1.0


def test_simulate_warns_above_the_table_and_flags_the_json(tmp_path):
    trace, path = _burst(tmp_path)
    runner = CliRunner()
    out = runner.invoke(simulate, ["--trace", str(trace), "--config", str(path)])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    warning = next(i for i, line in enumerate(lines) if line.startswith("warning:"))
    header = next(i for i, line in enumerate(lines) if line.startswith("policy"))
    assert warning < header
    assert "max_workers (1)" in lines[warning] and "the cap, not the policy" in out.output
    data = json.loads(
        runner.invoke(simulate, ["--trace", str(trace), "--config", str(path), "--json"]).output
    )
    assert data["saturated_at_max_workers"] is True
    assert all(p["saturated"] for p in data["policies"])
    assert any("max_workers" in w for w in data["warnings"])


def test_no_saturation_warning_when_the_cap_never_binds(tmp_path):
    trace = tmp_path / "one.csv"
    write_csv([Job(0.0, 60.0), Job(4000.0, 60.0)], trace)
    runner = CliRunner()
    out = runner.invoke(simulate, ["--trace", str(trace), "--config", str(write_config(tmp_path))])
    assert out.exit_code == 0, out.output
    assert "warning" not in out.output
    data = json.loads(
        runner.invoke(
            simulate, ["--trace", str(trace), "--config", str(write_config(tmp_path)), "--json"]
        ).output
    )
    assert data["saturated_at_max_workers"] is False and data["warnings"] == []


def test_the_legend_says_how_unserved_work_is_counted(tmp_path):
    trace = tmp_path / "one.csv"
    write_csv([Job(0.0, 60.0)], trace)
    out = CliRunner().invoke(
        simulate, ["--trace", str(trace), "--config", str(write_config(tmp_path))]
    )
    assert "never served" in out.output and "lower bound" in out.output
    assert "undone" in out.output


def test_a_metric_trigger_the_trace_cannot_feed_is_named(tmp_path):
    trace = tmp_path / "one.csv"
    write_csv([Job(0.0, 60.0)], trace)
    out = CliRunner().invoke(
        simulate,
        ["--trace", str(trace), "--config", str(EXAMPLES / "full.yaml"), "--queue", "llm"],
    )
    assert out.exit_code == 0, out.output
    assert "sum(vllm:num_requests_waiting)" in out.output
    assert "never fire" in out.output and "scale-down" in out.output
