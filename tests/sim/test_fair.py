"""Fair baselines, the references, the harder world and `autoscaler tune`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from autoscaler.sim.engine import World
from autoscaler.sim.reference import wait_floor, zero_wait_oracle
from autoscaler.sim.report import summarize
from autoscaler.sim.run import POLICIES, POOLED, compare, load_sim_config, run_watched
from autoscaler.sim.trace import Job, load_trace, write_csv
from autoscaler.sim.tracegen import GENERATORS, TRACES_DIR, UNSEEN
from autoscaler.sim.tune import Setting, cheapest, pareto, sweep, tune

CONFIG = TRACES_DIR / "sim-config.yaml"


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
        "providers": {"sim": {"kind": "mock", "boot_delay": 180, "price_per_hour": 0.6}},
        "queues": {"q": {"autoscale": block}},
    }
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.mark.parametrize("name", list(GENERATORS))
def test_fair_baselines_kill_nothing_and_serve_everything(name):
    cfg = load_sim_config(CONFIG)
    jobs = load_trace(TRACES_DIR / f"{name}.csv")
    reports, _ = compare(cfg, "inference", jobs)
    assert [r.policy for r in reports] == ["ours", POOLED, *list(POLICIES)[1:]]
    for r in reports:
        assert r.killed == 0 and r.never_served == 0, r
        assert r.ratio >= 1.0
    by = {r.policy: r for r in reports}
    # the scale-in delay only adds billed time, never changes who runs what
    assert by["keda+delay"].dollars > by["keda"].dollars
    assert by["keda+delay"].wait_p95 == by["keda"].wait_p95
    # no policy under max_workers beats the warm FIFO's waits
    floor = wait_floor(jobs, 16)
    for r in reports:
        assert r.wait_p95 >= floor.p95 and r.wait_max >= floor.max


def test_runqy_as_documented_does_not_stack_and_releases_per_worker(tmp_path):
    cfg = load_sim_config(write_config(tmp_path, max_workers=8))
    burst = [Job(0.0, 1200.0) for _ in range(3)]
    r = summarize(run_watched(cfg, "q", burst, "runqy")[0])
    assert r.launches <= 3 and r.killed == 0
    # one long job and one short one: the idle worker goes without waiting for the busy one
    jobs = [Job(0.0, 7200.0), Job(1.0, 60.0)]
    res = run_watched(cfg, "q", jobs, "runqy")[0]
    ends = sorted(m.ended_s - m.created_s for m in res.machines if m.ended_s is not None)
    assert ends[0] < 7200


def test_keda_counts_running_jobs_and_kills_nothing(tmp_path):
    cfg = load_sim_config(
        write_config(tmp_path, scale_up=[{"trigger": "queue_depth", "target_per_worker": 1}])
    )
    jobs = [Job(0.0, 1800.0), Job(1.0, 1800.0)]
    keda = summarize(run_watched(cfg, "q", jobs, "keda")[0])
    assert keda.killed == 0 and keda.never_served == 0


def test_zero_wait_oracle_reuses_a_machine_only_within_a_boot():
    # two jobs 100 s apart with a 180 s boot: one machine, kept idle 40 s
    o = zero_wait_oracle([Job(0, 60), Job(100, 60)], 180, 3600)
    assert o.rentals == 1 and o.dollars == pytest.approx(180 + 160)
    # 1000 s apart: renting anew is cheaper than keeping it
    o = zero_wait_oracle([Job(0, 60), Job(1000, 60)], 180, 3600, per_rental_dollars=1)
    assert o.rentals == 2 and o.dollars == pytest.approx(2 * 240 + 2)
    # overlapping jobs need two machines, or one with two slots
    assert zero_wait_oracle([Job(0, 60), Job(10, 60)], 180, 3600).rentals == 2
    assert zero_wait_oracle([Job(0, 60), Job(10, 60)], 180, 3600, concurrency=2).rentals == 1


def test_wait_floor_is_fifo_on_warm_machines():
    f = wait_floor([Job(0, 100), Job(0, 100), Job(0, 100)], 2)
    assert f.max == 100 and f.p50 == 0


def test_the_harder_world_kills_nothing_and_charges_rentals():
    cfg = load_sim_config(CONFIG)
    jobs = load_trace(TRACES_DIR / "spiky.csv")
    easy = summarize(run_watched(cfg, "inference", jobs, "ours")[0])
    hard = summarize(run_watched(cfg, "inference", jobs, "ours", world=World.realistic())[0])
    assert hard.killed == 0 and hard.never_served == 0
    assert hard.dollars >= hard.machine_hours * 0.6 + 0.02 * hard.launches - 1e-6
    assert easy.dollars == pytest.approx(easy.machine_hours * 0.6)


@pytest.mark.parametrize(
    "world",
    [
        World(blind_in_flight=True),
        World(blind_age=True),
        World(metric_lag_s=30),
        World(drain_race_s=5),
        World(worker_concurrency=3),
    ],
)
def test_every_world_knob_keeps_work_safe(world):
    cfg = load_sim_config(CONFIG)
    jobs = UNSEEN["short-burst"]()
    for policy in POLICIES:
        r = summarize(run_watched(cfg, "inference", jobs, policy, world=world)[0])
        assert r.killed == 0 and r.never_served == 0, (policy, world)


def test_worker_concurrency_runs_jobs_side_by_side(tmp_path):
    cfg = load_sim_config(write_config(tmp_path, max_workers=1))
    jobs = [Job(0.0, 600.0) for _ in range(3)]
    one = summarize(run_watched(cfg, "q", jobs, "ours")[0])
    three = summarize(run_watched(cfg, "q", jobs, "ours", world=World(worker_concurrency=3))[0])
    assert three.wait_max < one.wait_max


def test_a_drain_racing_a_pickup_finishes_the_job_first(tmp_path):
    cfg = load_sim_config(
        write_config(tmp_path, max_workers=1, scale_down=[{"trigger": "idle", "timeout": "1m"}])
    )
    # the next job lands inside the drain's race window of the idle worker
    jobs = [Job(0.0, 60.0), Job(400.0, 60.0)]
    r = summarize(run_watched(cfg, "q", jobs, "ours", world=World(drain_race_s=600))[0])
    assert r.killed == 0 and r.never_served == 0
    assert r.launches == 1  # the racing worker took the second job: no second rental


# ------------------------------------------------------------------ tune


def test_sweep_front_and_cheapest(tmp_path):
    cfg = load_sim_config(CONFIG)
    jobs = [Job(float(i * 200), 60.0) for i in range(40)]
    settings = [Setting(60, 2, None, 0), Setting(1800, 2, None, 0), Setting(300, 1, 60, 1)]
    results = sweep(cfg, "inference", jobs, settings, workers=1)
    assert [s for s, _ in results] == settings
    front = pareto(results)
    costs = [r.dollars for _, r in front]
    waits = [r.wait_p95 for _, r in front]
    assert costs == sorted(costs) and waits == sorted(waits, reverse=True)
    best = cheapest(results, 1e9)
    assert best is not None and best[1].dollars == min(r.dollars for _, r in results)
    assert cheapest(results, -1) is None


def test_tune_prints_the_choice_the_front_and_yaml(tmp_path, monkeypatch):
    import autoscaler.sim.tune as t

    monkeypatch.setattr(t, "IDLE_TIMEOUTS", (60.0, 600.0))
    monkeypatch.setattr(t, "TARGETS", (2,))
    monkeypatch.setattr(t, "MAX_LATENCIES", (None,))
    monkeypatch.setattr(t, "MIN_WORKERS", (0,))
    trace = tmp_path / "t.csv"
    write_csv([Job(float(i * 300), 60.0) for i in range(30)], trace)
    out = CliRunner().invoke(
        tune, ["--trace", str(trace), "--config", str(CONFIG), "--p95-wait", "1h", "--jobs", "1"]
    )
    assert out.exit_code == 0, out.output
    assert "cheapest holding the target" in out.output and "Pareto front" in out.output
    block = yaml.safe_load(out.output.split("(provider and instance unchanged):\n", 1)[1])
    assert block["max_workers"] == 16 and block["scale_down"][0]["trigger"] == "idle"
    # the block loads as a config
    doc = yaml.safe_load(CONFIG.read_text())
    doc["queues"]["inference"]["autoscale"].update(block)
    p = tmp_path / "tuned.yaml"
    p.write_text(yaml.safe_dump(doc))
    load_sim_config(p)


def test_a_fixed_idle_timeout_is_swept_and_pasted_as_learn_false():
    cfg = load_sim_config(CONFIG)
    base = cfg.queues["inference"].autoscale
    fixed, learned = Setting(300, 2, None, 0, learn=False), Setting(300, 2, None, 0)
    assert yaml.safe_load(fixed.yaml_block(base))["scale_down"][0]["learn"] is False
    assert "learn" not in yaml.safe_load(learned.yaml_block(base))["scale_down"][0]
    assert fixed.autoscale(base).scale_down[0].learn is False
    assert "(fixed)" in fixed.describe() and "(learned)" in learned.describe()
    # on jobs 11 minutes apart the learned timeout lets each machine go: cheaper than fixed
    jobs = [Job(float(i * 660), 60.0) for i in range(40)]
    (_, r_fixed), (_, r_learned) = sweep(cfg, "inference", jobs, [fixed, learned], workers=1)
    assert r_learned.dollars < r_fixed.dollars


def test_tune_refuses_bad_input(tmp_path):
    trace = tmp_path / "t.csv"
    write_csv([Job(0, 1)], trace)
    out = CliRunner().invoke(
        tune, ["--trace", str(trace), "--config", str(CONFIG), "--p95-wait", "soon"]
    )
    assert out.exit_code == 2 and "duration" in out.output


# ------------------------------------------------------------------ candidate rules


@pytest.mark.parametrize("name", ["sparse", "short-burst", "trickle"])
def test_candidate_rules_never_kill_and_serve_everything(name):
    from autoscaler.sim.candidates import CANDIDATES

    cfg = load_sim_config(CONFIG)
    jobs = UNSEEN[name]()
    reports, _ = compare(cfg, "inference", jobs, extra=CANDIDATES)
    for r in reports:
        assert r.killed == 0 and r.never_served == 0 and r.over_max == 0, r


def test_simulate_realistic_prints_the_references_and_what_each_baseline_is(tmp_path):
    from autoscaler.sim.cli import simulate

    trace = tmp_path / "t.csv"
    write_csv([Job(float(i * 120), 60.0) for i in range(30)], trace)
    out = CliRunner().invoke(
        simulate, ["--trace", str(trace), "--config", str(CONFIG), "--realistic"]
    )
    assert out.exit_code == 0, out.output
    for text in (
        "zero-wait oracle",
        "wait floor",
        "lower bound",
        "runqy as documented",
        "scale-in delay",
        "fast path",
    ):
        assert text in out.output, text


# ------------------------------------------------------------------ several queues, one account


def test_two_queues_share_the_account_cap_in_one_run(tmp_path):
    from autoscaler.policy.decide import decide
    from autoscaler.sim.engine import Account, Simulation

    block = {
        "provider": "sim",
        "min_workers": 0,
        "max_workers": 4,
        "scale_up": [{"trigger": "no_workers"}, {"trigger": "queue_depth", "target_per_worker": 1}],
        "scale_down": [{"trigger": "idle", "timeout": "5m"}],
        "instance": {"gpu": "x", "max_price_per_hour": 0.6},
    }
    doc = {
        "providers": {"sim": {"kind": "mock", "boot_delay": 180, "price_per_hour": 0.6}},
        "limits": {"max_machines": 3},
        "queues": {"a": {"autoscale": {**block, "priority": 1}}, "b": {"autoscale": block}},
    }
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(doc))
    cfg = load_sim_config(p)
    burst = [Job(float(i), 300.0) for i in range(8)]
    sims = [Simulation(cfg, q, burst, decide, name=q, day_s=3600, tail_s=3600) for q in "ab"]
    account = Account(sims)
    results = account.run()
    assert account.peak_machines <= 3  # alone, each queue would rent 4
    for r in results:
        rep = summarize(r)
        assert rep.killed == 0 and rep.never_served == 0
    # the higher priority queue was served first
    a, b = (summarize(r) for r in results)
    assert a.wait_p50 <= b.wait_p50
    # the cap, not the queues' max_workers, held them: decide() said so
    assert sum(r.waits_by_cap for r in results) > 0


def test_simulate_all_queues_runs_them_in_one_account(tmp_path):
    from autoscaler.sim.cli import simulate

    block = {
        "provider": "sim",
        "min_workers": 0,
        "max_workers": 4,
        "scale_up": [{"trigger": "no_workers"}, {"trigger": "queue_depth", "target_per_worker": 1}],
        "scale_down": [{"trigger": "idle", "timeout": "5m"}],
        "instance": {"gpu": "x", "max_price_per_hour": 0.6},
    }
    doc = {
        "providers": {"sim": {"kind": "mock", "boot_delay": 180, "price_per_hour": 0.6}},
        "limits": {"max_machines": 3},
        "queues": {"a": {"autoscale": block}, "b": {"autoscale": block}},
    }
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            f'{{"arrival_s": {i}, "runtime_s": 300, "queue": "{q}"}}\n'
            for i in range(6)
            for q in "ab"
        )
    )
    runner = CliRunner()
    out = runner.invoke(simulate, ["--trace", str(trace), "--config", str(cfg), "--all-queues"])
    assert out.exit_code == 0, out.output
    assert "2 queues in one account" in out.output
    data = json.loads(
        runner.invoke(
            simulate, ["--trace", str(trace), "--config", str(cfg), "--all-queues", "--json"]
        ).output
    )
    assert data["peak_machines_account"] <= 3
    assert [q["policy"] for q in data["queues"]] == ["a", "b"]
    assert all(q["jobs"] == 6 and q["never_served"] == 0 for q in data["queues"])
    # the baselines run beside ours, each queue on its own: nothing holds them to the cap
    assert set(data["baselines"]) == {"runqy", "keda", "keda+delay"}
    keda = data["baselines"]["keda"]
    assert [q["jobs"] for q in keda["queues"]] == [6, 6]
    assert keda["peak_machines_account"] > 3  # 4 + 4 machines wanted at once
    assert "keda" in out.output and "over max_machines 3" in out.output


def test_the_account_peak_counts_machines_billing_at_the_same_moment():
    from autoscaler.sim.engine import Result, SimMachine
    from autoscaler.sim.run import peak_machines

    def result(*spans):
        ms = [SimMachine(f"m{i}", a, 0.6, ended_s=b) for i, (a, b) in enumerate(spans)]
        return Result("x", [], {}, ms, 100.0, 0.6)

    assert peak_machines([result((0, 10), (5, 20)), result((8, 9), (10, 30))]) == 3
    assert peak_machines([result((0, 10)), result((10, 20))]) == 1  # touching is not overlap
    assert peak_machines([result((50, None))]) == 1  # still billing at the end


def test_sparse_jobs_cost_within_one_and_a_half_zero_wait_oracles():
    """A 60 s job every ~11 min: the learned idle timeout lets each machine go at once instead
    of paying the configured 5 min (with it off, ours costs 2.3× the oracle)."""
    cfg = load_sim_config(CONFIG)
    jobs = UNSEEN["sparse"]()
    ours = summarize(run_watched(cfg, "inference", jobs, "ours")[0])
    oracle = zero_wait_oracle(jobs, 180.0, 0.60)
    assert ours.killed == ours.never_served == 0
    assert ours.dollars <= 1.5 * oracle.dollars, (ours.dollars, oracle.dollars)


@pytest.mark.parametrize("name", ["steady", "diurnal"])
def test_no_fair_baseline_is_both_cheaper_and_faster_on_the_shipped_traces(name):
    from autoscaler.sim.run import dominated_by

    cfg = load_sim_config(CONFIG)
    reports, _ = compare(cfg, "inference", load_trace(TRACES_DIR / f"{name}.csv"))
    assert dominated_by(reports) == [], [(r.policy, r.dollars, r.wait_p95) for r in reports]


def test_dominated_by_names_a_baseline_cheaper_and_faster_only():
    from dataclasses import replace

    from autoscaler.sim.run import dominated_by

    cfg = load_sim_config(CONFIG)
    reports, _ = compare(cfg, "inference", UNSEEN["sparse"]()[:20])
    ours = next(r for r in reports if r.policy == "ours")
    keda = next(r for r in reports if r.policy == "keda")
    better = replace(keda, dollars=ours.dollars - 1, wait_p95=ours.wait_p95 - 1)
    assert dominated_by([ours, better]) == ["keda"]
    assert dominated_by([ours, replace(better, wait_p95=ours.wait_p95 + 1)]) == []
    assert dominated_by([ours, replace(better, killed=1)]) == []
