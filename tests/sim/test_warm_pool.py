"""Warm pools in the simulator: stopped instead of destroyed while the pool has room, resumed
before renting, a failed resume is a warm miss and a fresh rental, keep_for empties the pool,
storage billed while stopped; `simulate`, the benchmark and `tune` show and sweep the pool."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from autoscaler.config import load_config_text
from autoscaler.config.models import Config
from autoscaler.lifecycle import InstanceState
from autoscaler.policy import warm
from autoscaler.policy.decide import decide
from autoscaler.policy.plan import Plan
from autoscaler.policy.snapshot import Snapshot
from autoscaler.sim.engine import Result, SimMachine, Simulation, World
from autoscaler.sim.provider import RESUME_FAILURE_RATE, RESUME_S, STOP_S, ProviderParams
from autoscaler.sim.report import summarize
from autoscaler.sim.run import POLICIES, POOLED, UNPOOLED, compare, load_sim_config, peak_machines
from autoscaler.sim.trace import Job, write_csv
from autoscaler.sim.tracegen import TRACES_DIR, UNSEEN
from autoscaler.sim.tune import KEEP_FORS, Setting, pool_grid, pool_options, tune, tune_all

S = InstanceState
PRICE = 0.6
STORAGE = 0.06  # a tenth of the machine's price: large enough to see in the figures
BOOT = 180.0


def write_config(
    tmp_path: Path, pool: dict | None = None, provider: dict | None = None, **auto
) -> Path:
    """One queue on a mock provider with the warm pool's numbers set. The boot timeout is
    4 min, at most 1.5 × the boot estimate: decide()'s hedged launch is off, so these tests
    see the pool alone (the hedge's interplay with resumes: the test below)."""
    block = {
        "provider": "sim",
        "min_workers": 0,
        "max_workers": 4,
        "boot_timeout": "4m",
        "scale_up": [{"trigger": "no_workers"}, {"trigger": "queue_depth", "target_per_worker": 1}],
        "scale_down": [{"trigger": "idle", "timeout": "1m", "learn": False}],
        "instance": {"gpu": "x", "max_price_per_hour": PRICE},
        "warm_pool": pool if pool is not None else {"size": 1, "keep_for": "1h"},
    }
    block.update(auto)
    prov = {
        "kind": "mock",
        "boot_delay": BOOT,
        "price_per_hour": PRICE,
        "start_delay": RESUME_S,
        "stop_delay": STOP_S,
        "resume_failure_rate": 0.0,
        "storage_price_per_hour": STORAGE,
    }
    prov.update(provider or {})
    doc = {"providers": {"sim": prov}, "queues": {"q": {"autoscale": block}}}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def simulate(
    tmp_path: Path, jobs: list[Job], policy=decide, world: World | None = None, seed: int = 0, **kw
) -> tuple[Simulation, Result]:
    config = load_sim_config(write_config(tmp_path, **kw))
    sim = Simulation(
        config,
        "q",
        jobs,
        policy,
        seed=seed,
        day_s=3600,
        tail_s=3 * 3600,
        world=world,
        keep_log=True,
    )
    return sim, sim.run()


def waits(result: Result) -> list[float]:
    return [result.starts[i] - j.arrival_s for i, j in enumerate(result.jobs)]


# ------------------------------------------------------------------ stop instead of destroy


def test_a_drained_machine_is_stopped_while_the_pool_has_room_and_destroyed_beyond_it(tmp_path):
    # two jobs at once: two machines, idle together; a pool of one keeps one of them
    _, r = simulate(tmp_path, [Job(0.0, 600.0), Job(0.0, 600.0)])
    assert len(r.machines) == 2 and r.stops == 1
    stopped = [m for m in r.machines if m.stopped]
    destroyed = [m for m in r.machines if not m.stopped]
    assert len(stopped) == 1 and len(destroyed) == 1
    # the first drained took the pool's place (stopped a stop's time later); the other was
    # destroyed when drained, the pool being full
    (kept,) = stopped
    (gone,) = destroyed
    since, until = kept.stopped[0]
    assert since - STOP_S <= gone.ended_s and until is None
    # without a pool both are destroyed, as before warm pools
    _, r0 = simulate(tmp_path, [Job(0.0, 600.0), Job(0.0, 600.0)], pool={"size": 0})
    assert r0.stops == 0 and all(not m.stopped for m in r0.machines)


def test_the_pool_never_holds_more_than_its_size(tmp_path):
    """A burst of 4 machines, size 2: at every evaluation at most 2 are stopping or stopped,
    and a stopped machine is never capacity."""
    seen: list[int] = []

    def watch(snapshot: Snapshot, config: Config, now: datetime) -> Plan:
        qs = snapshot.queues[0]
        seen.append(sum(1 for m in qs.machines if m.warm))
        return decide(snapshot, config, now)

    jobs = [Job(0.0, 300.0) for _ in range(4)] + [Job(2400.0, 300.0) for _ in range(4)]
    _, r = simulate(tmp_path, jobs, policy=watch, pool={"size": 2, "keep_for": "1h"})
    assert max(seen) == 2
    assert r.stops >= 2 and r.resumes == 2  # the second burst resumed the two, rented two
    assert summarize(r).launches == 6


# ------------------------------------------------------------------ resume before renting


def test_a_launch_resumes_a_stopped_machine_before_renting(tmp_path):
    sim, r = simulate(tmp_path, [Job(0.0, 60.0), Job(3000.0, 60.0)])
    assert len(r.machines) == 1, "the second job got the stopped machine, not a new rental"
    assert r.resumes == r.warm_hits == 1 and r.warm_misses == 0
    first, second = waits(r)
    assert 0.75 * BOOT <= first <= 1.25 * BOOT  # a cold boot
    assert 0.75 * RESUME_S <= second <= 1.25 * RESUME_S  # a resume
    # decide() saw the machine as fitting the spec it rents now
    (m,) = r.machines
    assert m.spec_key == warm.spec_key(sim.auto) and m.resumes == 1
    assert any("resume" in entry for entry in r.log)


def test_a_resumed_machine_looks_to_decide_as_production_s_row_does(tmp_path):
    """As `store.moves`: a resume forgets the machine's last task (idle since it is ready
    again, not since before its stop), and only cold boots feed the boot estimate (a resumed
    machine's ready came hours after its rental)."""
    resuming: list[datetime | None] = []
    estimates: list[float] = []

    def watch(snapshot: Snapshot, config: Config, now: datetime) -> Plan:
        qs = snapshot.queues[0]
        resuming.extend(m.last_task_at for m in qs.machines if m.state == S.RESUMING)
        if qs.boot_estimate is not None:
            estimates.append(qs.boot_estimate)
        return decide(snapshot, config, now)

    jobs = [Job(0.0, 60.0), Job(3000.0, 60.0), Job(6000.0, 60.0)]
    _, r = simulate(tmp_path, jobs, policy=watch)
    assert r.resumes == 2 and len(r.machines) == 1
    assert resuming and all(t is None for t in resuming)
    assert estimates and max(estimates) <= 1.25 * BOOT  # the one cold boot, never a resume


def test_a_failed_resume_is_a_warm_miss_and_a_fresh_machine_is_rented(tmp_path):
    sim, r = simulate(
        tmp_path, [Job(0.0, 60.0), Job(3000.0, 60.0)], provider={"resume_failure_rate": 1.0}
    )
    assert r.resumes == 1 and r.warm_misses == 1 and r.warm_hits == 0
    assert len(r.machines) == 2  # the missed one destroyed, a fresh one rented
    missed, fresh = r.machines
    assert missed.ended_s is not None and missed.ended_s < fresh.created_s
    # the miss is no rental failure: no backoff held the fresh rental
    assert r.failed_rentals == 0 and sim.backoff is None
    # seen when the start answered (about a resume), rented at the next evaluation (a poll)
    assert fresh.created_s - 3000.0 <= 1.25 * RESUME_S + sim.poll + 1e-6
    second = waits(r)[1]
    assert 0.75 * RESUME_S + 0.75 * BOOT <= second <= 1.25 * (RESUME_S + BOOT) + sim.poll


def test_a_vast_miss_is_seen_at_the_resume_timeout_a_runpod_one_when_the_start_answers():
    doc = {
        "providers": {
            "rp": {"kind": "runpod", "api_key_env": "RP_KEY", "volume_gb": 100},
            "va": {"kind": "vast", "api_key_env": "VA_KEY"},
        },
        "queues": {
            name: {
                "autoscale": {
                    "provider": prov,
                    "max_workers": 2,
                    "scale_up": [{"trigger": "no_workers"}],
                    "scale_down": [{"trigger": "idle", "timeout": "5m"}],
                    "instance": {"gpu": "RTX 4090", "max_price_per_hour": 0.5, "disk_gb": 40},
                }
            }
            for name, prov in (("a", "rp"), ("b", "va"))
        },
    }
    config = load_config_text(yaml.safe_dump(doc), "c.yaml")
    rp = ProviderParams.for_queue(config, config.queues["a"].autoscale)
    va = ProviderParams.for_queue(config, config.queues["b"].autoscale)
    assert rp.boot_s == va.boot_s == 180 and rp.resume_s == va.resume_s == RESUME_S
    assert rp.resume_failure_rate == va.resume_failure_rate == RESUME_FAILURE_RATE
    assert not rp.miss_seen_at_timeout and va.miss_seen_at_timeout
    # RunPod bills the volume at $0.20/GB-month; Vast (priced per host) assumed the same rate
    assert rp.storage_price_per_hour == pytest.approx(100 * 0.20 / 730, rel=1e-3)
    assert va.storage_price_per_hour == pytest.approx(40 * 0.20 / 730, rel=1e-3)


def test_a_mock_provider_s_own_numbers_win_and_the_assumptions_fill_the_rest():
    config = load_sim_config(TRACES_DIR / "sim-config.yaml")
    p = ProviderParams.for_queue(config, config.queues["inference"].autoscale)
    # the benchmark's mock provider sets none of them: 40 s resumes, 10 % misses, 50 GB disk
    assert (p.resume_s, p.stop_s, p.resume_failure_rate) == (RESUME_S, STOP_S, RESUME_FAILURE_RATE)
    assert p.storage_price_per_hour == pytest.approx(50 * 0.20 / 730, rel=1e-3)


# ------------------------------------------------------------------ keep_for, storage


def test_keep_for_empties_the_pool(tmp_path):
    sim, r = simulate(tmp_path, [Job(0.0, 60.0)], pool={"size": 1, "keep_for": "10m"})
    (m,) = r.machines
    ((since, until),) = m.stopped
    assert until is None and r.retired == 1  # destroyed stopped, never resumed
    assert 600 <= m.ended_s - since <= 600 + sim.poll
    assert not sim.live  # nothing left billing


def test_a_stopped_machine_bills_its_storage_price_not_the_machine_s(tmp_path):
    world = World(per_rental_dollars=0.5)
    _, r = simulate(tmp_path, [Job(0.0, 60.0), Job(3000.0, 60.0)], world=world)
    rep = summarize(r)
    (m,) = r.machines
    assert len(m.stopped) == 2  # stopped, resumed for the second job, stopped again
    (s1, e1), (s2, e2) = m.stopped
    assert e1 is not None and e2 is None  # the second stop lasts until keep_for or the end
    stopped = (e1 - s1) + (m.ended_s - s2)
    running = sum(b - a for a, b in m.running_spans(r.end_s))
    assert running + stopped == pytest.approx(m.ended_s - m.created_s)
    assert rep.stopped_hours == pytest.approx(stopped / 3600)
    assert rep.storage_dollars == pytest.approx(stopped / 3600 * STORAGE)
    assert rep.machine_hours == pytest.approx(running / 3600)
    # one rental fee: a resume rents nothing
    assert rep.dollars == pytest.approx(running / 3600 * PRICE + rep.storage_dollars + 0.5)
    # the stop itself is billed at the full price: the first span runs until it is stopped,
    # a stop's time after its drain (an idle minute after its job)
    first = m.running_spans(r.end_s)[0]
    assert first[1] == s1 and s1 - STOP_S >= 0.75 * BOOT + 60 + 60


def test_the_account_peak_does_not_count_stopped_machines():
    a = SimMachine("a", 0.0, PRICE, ended_s=100.0, stopped=[(10.0, 90.0)])
    b = SimMachine("b", 20.0, PRICE, ended_s=80.0)
    assert peak_machines([Result("x", [], {}, [a, b], 100.0, PRICE)]) == 1
    assert a.running_spans(100.0) == [(0.0, 10.0), (90.0, 100.0)]
    assert a.stopped_seconds(100.0) == 80.0


# ------------------------------------------------------------------ the hedge and resumes


def test_no_fresh_machine_is_rented_beside_a_resume_by_decide():
    """A resuming machine was rented long ago; measured from that rental it would look hours
    late to decide()'s hedge, which rented beside nearly every resume (sparse day: 127 rentals
    for 129 resumes with a pool of one). A resume is judged by its resume_timeout instead, so
    fresh machines are rented only after warm misses (and the first cold boots)."""
    config = load_sim_config(TRACES_DIR / "sim-config.yaml")
    config = _pool(config, 1)
    jobs = UNSEEN["sparse"]()
    sim = Simulation(config, "inference", jobs, decide, world=World.realistic())
    r = sim.run()
    rep = summarize(r)
    assert rep.killed == 0 and rep.never_served == 0
    assert r.resumes > 100
    assert rep.launches <= r.warm_misses + 5, (rep.launches, r.warm_misses)


def _pool(config: Config, size: int, keep_for: float = 3600.0) -> Config:
    from autoscaler.config.machine_specs import WarmPool
    from autoscaler.sim.run import with_pool

    return with_pool(config, "inference", WarmPool(size=size, keep_for=keep_for))


# ------------------------------------------------------------------ simulate, benchmark, tune


def test_compare_shows_ours_with_and_without_a_pool_and_the_baselines_without():
    config = load_sim_config(TRACES_DIR / "sim-config.yaml")
    jobs = UNSEEN["sparse"]()[:30]
    reports, _ = compare(config, "inference", jobs)
    names = [r.policy for r in reports]
    assert names == ["ours", POOLED, *list(POLICIES)[1:]]
    by = {r.policy: r for r in reports}
    assert by[POOLED].resumes > 0 and by["ours"].resumes == 0
    assert all(by[b].resumes == 0 and by[b].stopped_hours == 0 for b in POLICIES)
    # a config with its own pool: ours runs with it, the variant without
    reports, _ = compare(_pool(config, 2), "inference", jobs)
    by = {r.policy: r for r in reports}
    assert by["ours"].resumes > 0 and by[UNPOOLED].resumes == 0


def test_simulate_prints_the_pooled_row_and_the_model_s_assumptions(tmp_path):
    from autoscaler.sim.cli import simulate as simulate_cmd

    trace = tmp_path / "t.csv"
    write_csv([Job(float(i * 900), 60.0) for i in range(12)], trace)
    config = TRACES_DIR / "sim-config.yaml"
    runner = CliRunner()
    out = runner.invoke(simulate_cmd, ["--trace", str(trace), "--config", str(config)])
    assert out.exit_code == 0, out.output
    assert any(line.startswith(POOLED) for line in out.output.splitlines())
    assert "resume 40 s" in out.output and "10% of resumes fail" in out.output
    assert "resumes (" in out.output and "of storage" in out.output
    data = json.loads(
        runner.invoke(
            simulate_cmd, ["--trace", str(trace), "--config", str(config), "--json"]
        ).output
    )
    pooled = next(p for p in data["policies"] if p["policy"] == POOLED)
    assert pooled["resumes"] > 0 and pooled["storage_dollars"] > 0


def test_tune_sweeps_the_pool_size_and_keep_for_on_the_front():
    config = load_sim_config(TRACES_DIR / "sim-config.yaml")
    assert pool_options(16) == [(n, k) for n in (1, 2, 4, 8, 16) for k in KEEP_FORS]
    assert [n for n, _ in pool_options(3)][:: len(KEEP_FORS)] == [1, 2, 3]
    base = Setting(60, 2, None, 0)
    grid = pool_grid([base], 16)
    assert {(s.pool_size, s.keep_for) for s in grid} == set(pool_options(16))
    # the setting carries its pool into the config and the pasted block
    s = grid[-1]
    auto = config.queues["inference"].autoscale
    assert s.autoscale(auto).warm_pool.size == s.pool_size
    block = yaml.safe_load(s.yaml_block(auto))
    assert block["warm_pool"] == {"size": 16, "keep_for": "24h"}
    assert "pool 16 for 24h" in s.describe()
    # jobs 11 min apart: the settings on the front come again with every pool, which resume
    # (a wait of a resume, not a boot)
    jobs = [Job(float(i * 660), 60.0) for i in range(30)]
    plain = [base, Setting(300, 2, None, 0)]
    results, pooled = tune_all(config, "inference", jobs, workers=1, settings=plain)
    assert pooled == len(pool_options(16)) and len(results) == 2 + pooled
    swept = {(s.idle_timeout, s.pool_size, s.keep_for) for s, _ in results[2:]}
    assert swept == {(60, n, k) for n, k in pool_options(16)}  # idle 1m: the front
    no_pool = results[0][1]
    assert all(r.wait_p95 < no_pool.wait_p95 and r.resumes > 0 for _, r in results[2:])
    # decide() rents nothing beside a resume: a pool is also the cheapest
    assert min(results, key=lambda x: x[1].dollars)[0].pool_size > 0


def test_tune_prints_the_pool_it_chose_and_the_best_without(tmp_path, monkeypatch):
    import autoscaler.sim.tune as t

    monkeypatch.setattr(t, "IDLE_TIMEOUTS", (60.0,))
    monkeypatch.setattr(t, "TARGETS", (2,))
    monkeypatch.setattr(t, "MAX_LATENCIES", (None,))
    monkeypatch.setattr(t, "MIN_WORKERS", (0,))
    monkeypatch.setattr(t, "LEARN", (False,))
    monkeypatch.setattr(t, "POOL_SIZES", (1,))
    monkeypatch.setattr(t, "KEEP_FORS", (3600.0,))
    trace = tmp_path / "t.csv"
    write_csv([Job(float(i * 660), 60.0) for i in range(30)], trace)
    config = TRACES_DIR / "sim-config.yaml"
    # a target only resumes hold: without a pool the p95 is a failed boot's (528 s); with one,
    # a warm miss's (a resume, then a cold boot: 270 s)
    out = CliRunner().invoke(
        tune, ["--trace", str(trace), "--config", str(config), "--p95-wait", "5m", "--jobs", "1"]
    )
    assert out.exit_code == 0, out.output
    assert "with 1 warm pools each" in out.output
    assert "pool 1 for 1h *" in out.output
    assert "without a warm pool no setting holds the target" in out.output
    block = yaml.safe_load(out.output.split("(provider and instance unchanged):\n", 1)[1])
    assert block["warm_pool"] == {"size": 1, "keep_for": "1h"}
    doc = yaml.safe_load(config.read_text())
    doc["queues"]["inference"]["autoscale"].update(block)
    p = tmp_path / "tuned.yaml"
    p.write_text(yaml.safe_dump(doc))
    assert load_sim_config(p).queues["inference"].autoscale.warm_pool.size == 1
