"""Placement across providers in the simulator: one simulated provider per listed provider
(price, boots, capacity windows), launches ranked by `policy.placement.rank` failing over on a
capacity error, a backoff per (queue, provider), machines billed at their own provider's price;
`simulate --outage` and the list beside each provider alone; the issue's measure on the
shipped days (`benchmarks/placement_sim.py`)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from autoscaler.config.models import Config
from autoscaler.policy.backoff import active_backoff
from autoscaler.policy.decide import decide
from autoscaler.policy.plan import Plan
from autoscaler.policy.snapshot import Snapshot
from autoscaler.sim.cli import simulate
from autoscaler.sim.engine import Simulation, World
from autoscaler.sim.placement import (
    OutageDay,
    billed_hours_between,
    busiest_window,
    compare_placement,
    outage_day,
    uses,
)
from autoscaler.sim.provider import Outage, parse_outage
from autoscaler.sim.report import summarize
from autoscaler.sim.run import load_sim_config, run_watched
from autoscaler.sim.trace import Job, load_trace, write_csv
from autoscaler.sim.tracegen import TRACES_DIR

CHEAP, DEAR = 0.40, 0.60
BOOT = 180.0


def write_config(
    tmp_path: Path,
    provider: str | list[str] | None = None,
    cheap: dict | None = None,
    dear: dict | None = None,
    **auto,
) -> Path:
    """One queue on two mock providers (both listed unless `provider` says), $0.40/h and
    $0.60/h, 3 min boots, no failures."""
    block = {
        "provider": provider if provider is not None else ["cheap", "dear"],
        "min_workers": 0,
        "max_workers": 4,
        "scale_up": [{"trigger": "no_workers"}, {"trigger": "queue_depth", "target_per_worker": 1}],
        "scale_down": [{"trigger": "idle", "timeout": "2m", "learn": False}],
        "instance": {"gpu": "x", "max_price_per_hour": DEAR},
    }
    block.update(auto)
    providers = {
        "cheap": {"kind": "mock", "boot_delay": BOOT, "price_per_hour": CHEAP, **(cheap or {})},
        "dear": {"kind": "mock", "boot_delay": BOOT, "price_per_hour": DEAR, **(dear or {})},
    }
    doc = {"providers": providers, "queues": {"q": {"autoscale": block}}}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def jobs_every(gap: float, n: int, runtime: float = 300.0, start: float = 0.0) -> list[Job]:
    return [Job(start + i * gap, runtime) for i in range(n)]


def run(config: Config, jobs: list[Job], policy=decide, world: World | None = None, seed: int = 0):
    sim = Simulation(config, "q", jobs, policy, seed=seed, world=world)
    return sim, sim.run()


# ------------------------------------------------------------------ one provider, unchanged


def test_one_provider_runs_are_the_runs_before_placement():
    """A queue naming one provider replays exactly as before placement (figures measured on
    the tree before it, to the last digit), and `provider: [p]` is the same run. Since the
    simulator runs production's reconcile each poll, a failed boot is destroyed (and backs its
    provider off) at the first round past the boot timeout or past its provider's "dead", as
    in production, not at that instant: diurnal's 10 failed boots bill 38.8 s more ($42.71368
    before), keda's $44.03856 before, spiky realistic's 12 $35.60845 / p95 861.21 s before."""
    cfg = load_sim_config(TRACES_DIR / "sim-config.yaml")
    jobs = load_trace(TRACES_DIR / "diurnal.csv")
    r = summarize(run_watched(cfg, "inference", jobs, "ours")[0])
    assert (r.dollars, r.wait_p95, r.launches, r.failed_rentals) == (
        42.72014999999999,
        262.47430764765886,
        160,
        11,
    )
    keda = summarize(run_watched(cfg, "inference", jobs, "keda")[0])
    assert (keda.dollars, keda.wait_p95, keda.launches) == (
        44.0403649807827,
        251.72048333667772,
        124,
    )
    spiky = load_trace(TRACES_DIR / "spiky.csv")
    hard = summarize(run_watched(cfg, "inference", spiky, "ours", world=World.realistic())[0])
    assert (hard.dollars, hard.wait_p95, hard.launches) == (
        35.64485000000003,
        861.9124877538743,
        253,
    )
    q = cfg.queues["inference"]
    assert q.autoscale is not None
    auto = q.autoscale.model_copy(update={"provider": ("sim-gpu",)})
    one_list = cfg.model_copy(
        update={"queues": {"inference": q.model_copy(update={"autoscale": auto})}}
    )
    assert one_list.queues["inference"].autoscale.providers == ("sim-gpu",)
    assert summarize(run_watched(one_list, "inference", jobs, "ours")[0]) == r
    assert compare_placement(cfg, "inference", jobs) == []  # no rows for one provider


# ------------------------------------------------------------------ placement and failover


def test_cheapest_rents_the_cheaper_and_bills_each_machine_its_own_price(tmp_path):
    cfg = load_sim_config(write_config(tmp_path))
    _, r = run(cfg, jobs_every(600.0, 6))
    assert {m.provider for m in r.machines} == {"cheap"}
    assert all(m.price == CHEAP for m in r.machines)
    rep = summarize(r)
    assert rep.dollars == pytest.approx(rep.machine_hours * CHEAP)
    # the lower bound is at the cheapest listed price
    assert rep.lower_bound_dollars == pytest.approx(6 * 300 / 3600 * CHEAP)


@pytest.mark.parametrize(
    "rule,provider,cheap,dear,expected",
    [
        ("in_order", ["dear", "cheap"], {}, {}, "dear"),
        ("cheapest", ["dear", "cheap"], {}, {}, "cheap"),
        ("fastest", ["cheap", "dear"], {"boot_delay": 300}, {"boot_delay": 60}, "dear"),
        # within 5 % of the cheapest price: a tie, and the faster boot wins it
        ("cheapest", ["cheap", "dear"], {"boot_delay": 300}, {"price_per_hour": 0.41}, "dear"),
    ],
)
def test_the_queue_placement_rule_ranks_the_offers(tmp_path, rule, provider, cheap, dear, expected):
    cfg = load_sim_config(write_config(tmp_path, provider, cheap, dear, placement=rule))
    _, r = run(cfg, jobs_every(900.0, 3))
    assert {m.provider for m in r.machines} == {expected}


def test_an_outage_fails_over_to_the_other_provider_and_backs_the_first_off(tmp_path):
    cfg = load_sim_config(write_config(tmp_path))
    outage = Outage("cheap", 3000.0, 6000.0)
    seen: list[tuple[float, dict[str, int]]] = []

    def watch(snapshot: Snapshot, config: Config, now: datetime) -> Plan:
        qs = snapshot.queues[0]
        seen.append(
            (
                (now - datetime(2025, 3, 3, tzinfo=now.tzinfo)).total_seconds(),
                {b.provider: b.failures for b in qs.backoffs},
            )
        )
        return decide(snapshot, config, now)

    jobs = jobs_every(400.0, 25, runtime=200.0)
    _, r = run(cfg, jobs, watch, World(outages=(outage,)))
    inside = [m for m in r.machines if outage.covers(m.created_s)]
    outside = [m for m in r.machines if not outage.covers(m.created_s)]
    assert inside and all(m.provider == "dear" for m in inside)  # failed over, at once
    assert outside and all(m.provider == "cheap" for m in outside)
    assert r.failed_rentals >= 1
    assert any("cheap" in b and "dear" not in b for t, b in seen if outage.covers(t))
    rep = summarize(r)
    assert rep.never_served == 0
    # nobody waited for the outage: at most a boot (±25 %) and a poll
    assert rep.wait_max <= 1.25 * BOOT + 30
    cost = sum(sum(b - a for a, b in m.running_spans(r.end_s)) / 3600 * m.price for m in r.machines)
    assert rep.dollars == pytest.approx(cost)
    split = {u.provider: u for u in uses(r)}
    assert split["dear"].rentals == len(inside) and split["cheap"].rentals == len(outside)
    assert sum(u.dollars for u in split.values()) == pytest.approx(rep.dollars)


def test_alone_the_provider_in_an_outage_makes_jobs_wait_for_it(tmp_path):
    cfg = load_sim_config(write_config(tmp_path, "cheap"))
    _, r = run(cfg, [Job(3600.0, 60.0)], world=World(outages=(Outage("cheap", 3000.0, 6000.0),)))
    rep = summarize(r)
    assert r.machines and r.machines[0].created_s >= 6000.0
    assert rep.wait_max >= 6000.0 - 3600.0 + 0.75 * BOOT
    assert rep.failed_rentals >= 2  # retried under its backoff through the outage


def test_a_provider_in_backoff_is_never_rented_from(tmp_path):
    """Every boot on `cheap` fails (its backoff grows); the policy names both providers in
    every launch regardless of backoffs (as decide() did before it gave launches fallbacks),
    so only the simulator's own guard keeps it from renting from `cheap` under backoff."""
    cfg = load_sim_config(
        write_config(tmp_path, cheap={"boot_failure_rate": 1.0}, boot_timeout="4m")
    )
    held_at: list[tuple[float, frozenset[str]]] = []

    def careless(snapshot: Snapshot, config: Config, now: datetime) -> Plan:
        qs = snapshot.queues[0]
        held = frozenset(b.provider for b in qs.backoffs if active_backoff(b, now))
        held_at.append(((now - datetime(2025, 3, 3, tzinfo=now.tzinfo)).total_seconds(), held))
        return decide(snapshot, config, now)

    sim = Simulation(cfg, "q", jobs_every(300.0, 40, runtime=250.0), careless)
    original = sim._launch

    def any_provider(reason: str, providers=()) -> None:
        original(reason, ("cheap", "dear"))  # ignores decide()'s choice

    sim._launch = any_provider  # type: ignore[method-assign]
    r = sim.run()
    on_cheap = [m for m in r.machines if m.provider == "cheap"]
    assert on_cheap and any(m.provider == "dear" for m in r.machines)
    for m in r.machines:
        # the evaluation that rented it is the last one at or before its rental
        held = [h for t, h in held_at if t <= m.created_s][-1]
        assert m.provider not in held, (m.launch_id, m.created_s, held)
    # the guard was needed: some launches came while `cheap` was in backoff
    assert any("cheap" in h for _, h in held_at)
    assert summarize(r).never_served == 0


def test_each_provider_has_its_own_backoff_and_the_queue_waits_when_all_wait(tmp_path):
    cfg = load_sim_config(write_config(tmp_path))
    world = World(outages=(Outage("cheap", 0.0, 5000.0), Outage("dear", 0.0, 3000.0)))
    shown: list[tuple[float, tuple[str, ...], int]] = []

    def watch(snapshot: Snapshot, config: Config, now: datetime) -> Plan:
        qs = snapshot.queues[0]
        plan = decide(snapshot, config, now)
        t = (now - datetime(2025, 3, 3, tzinfo=now.tzinfo)).total_seconds()
        shown.append((t, tuple(b.provider for b in qs.backoffs), len(plan.launches)))
        return plan

    sim, r = run(cfg, [Job(100.0, 60.0)], watch, world)
    assert any(len(set(bs)) == 2 for _, bs, _ in shown)  # both providers backed off at once
    (m,) = r.machines
    assert m.provider == "dear" and m.created_s >= 3000.0  # the first to have capacity again
    assert "dear" not in sim.backoffs  # its machine came up: its backoff ended
    assert set(sim.backoffs) == {"cheap"}


# ------------------------------------------------------------------ outages, CLI, report


def test_outages_are_parsed_as_hours_into_the_trace():
    assert parse_outage("gpu-vast@10:00-12:00") == Outage("gpu-vast", 36000.0, 43200.0)
    assert parse_outage("a@23:30-25:00:30") == Outage("a", 84600.0, 90030.0)
    assert parse_outage("a@100-250.5") == Outage("a", 100.0, 250.5)
    assert parse_outage("a@10:00-12:00").describe() == "a@10:00-12:00"
    for bad in ("a@12:00-10:00", "a10:00-12:00", "a@10:00", "@1-2", "a@9:75-10:00", "a@x-y"):
        with pytest.raises(ValueError, match="outage"):
            parse_outage(bad)


def test_the_busiest_window_is_where_most_work_arrives():
    jobs = [Job(100.0, 60.0), *(Job(7200.0 + i, 600.0) for i in range(10)), Job(20000.0, 60.0)]
    w = busiest_window(jobs, 3600.0)
    assert (w.start_s, w.end_s) == (7200.0, 10800.0)


def test_simulate_shows_the_list_beside_each_provider_alone(tmp_path):
    trace = tmp_path / "t.csv"
    write_csv(jobs_every(400.0, 25, runtime=200.0), trace)
    config = write_config(tmp_path)
    out = CliRunner().invoke(
        simulate,
        [
            "--trace",
            str(trace),
            "--config",
            str(config),
            "--outage",
            "cheap@00:50-01:40",
        ],
    )
    assert out.exit_code == 0, out.output
    assert "placement cheapest over cheap $0.40/h, boot 180 s; dear $0.60/h" in out.output
    assert "outages (every rental fails with a capacity error): cheap@00:50-01:40" in out.output
    for label in ("cheapest over the list", "cheap alone", "dear alone", "the list rented:"):
        assert label in out.output
    data = json.loads(
        CliRunner()
        .invoke(
            simulate,
            [
                "--trace",
                str(trace),
                "--config",
                str(config),
                "--outage",
                "cheap@3000-6000",
                "--json",
            ],
        )
        .output
    )
    assert data["outages"] == [{"provider": "cheap", "start_s": 3000.0, "end_s": 6000.0}]
    runs = {r["policy"]: r for r in data["placement"]["runs"]}
    listed, cheap = runs["cheapest over the list"], runs["cheap alone"]
    assert set(listed["by_provider"]) == {"cheap", "dear"}
    assert listed["wait_p95"] < cheap["wait_p95"]  # alone, jobs waited for the outage's end
    assert runs["dear alone"]["by_provider"].keys() == {"dear"}


def test_simulate_keeps_its_format_for_one_provider_and_refuses_unknown_outages(tmp_path):
    trace = tmp_path / "t.csv"
    write_csv(jobs_every(400.0, 5), trace)
    one = write_config(tmp_path, "cheap")
    data = json.loads(
        CliRunner().invoke(simulate, ["--trace", str(trace), "--config", str(one), "--json"]).output
    )
    assert "placement" not in data and "outages" not in data
    out = CliRunner().invoke(simulate, ["--trace", str(trace), "--config", str(one)])
    assert out.output.startswith("queue q: 5 jobs, $0.40/h per machine\n")
    assert "placement:" not in out.output
    refused = CliRunner().invoke(
        simulate, ["--trace", str(trace), "--config", str(one), "--outage", "dear@10:00-12:00"]
    )
    assert refused.exit_code == 2 and "'dear'" in refused.output and "cheap" in refused.output
    bad = CliRunner().invoke(
        simulate, ["--trace", str(trace), "--config", str(one), "--outage", "cheap@12:00-10:00"]
    )
    assert bad.exit_code == 2 and "ends before it starts" in bad.output


def test_window_hours_count_only_the_outage_span():
    from autoscaler.sim.engine import Result, SimMachine

    ms = [SimMachine("a", 0.0, CHEAP, ended_s=7200.0), SimMachine("b", 5400.0, DEAR)]
    r = Result("x", [], {}, ms, 9000.0, CHEAP)
    assert billed_hours_between(r, 3600.0, 7200.0) == pytest.approx(1.0 + 0.5)


# ------------------------------------------------------------------ the measure


@pytest.fixture(scope="module")
def shipped_days() -> dict[str, OutageDay]:
    cfg = load_sim_config(TRACES_DIR / "placement-config.yaml")
    return {
        name: outage_day(cfg, "inference", load_trace(TRACES_DIR / f"{name}.csv"), 2.0, 0)
        for name in ("steady", "diurnal", "spiky")
    }


@pytest.mark.parametrize("name", ["steady", "diurnal", "spiky"])
def test_with_the_list_an_outage_of_the_cheaper_keeps_the_waits(shipped_days, name):
    """The cheaper provider out 2 h at the day's busiest stretch (seed 0, default world):
    the list's p95 within 10 % of the day without the outage, nothing unserved; the cheaper
    alone makes jobs wait for the outage's end; what the outage cost the list is no more than
    the price gap on the hours it billed on the dearer provider."""
    day = shipped_days[name]
    a, b, c, d = day.runs
    assert day.waits_hold(), (name, day.p95_ratio())
    assert b.report.never_served == 0 and b.report.killed == 0
    assert b.dear_hours > a.dear_hours  # the dearer provider took the outage's launches
    assert c.report.wait_p95 >= 1.9 * b.report.wait_p95  # alone: jobs wait the outage out
    assert d.report.dollars >= 1.4 * a.report.dollars  # the dearer alone: about 1.5×
    # what the outage cost the list is the price gap on the dearer provider's hours
    assert day.extra() <= day.price_gap * b.dear_hours


@pytest.mark.parametrize("name", ["steady", "diurnal"])
def test_the_outage_costs_at_most_the_price_gap_on_its_hours(shipped_days, name):
    """(b) − (a) ≤ $0.20/h × the machine-hours billed during the outage. Holds on steady and
    diurnal with seed 0; not everywhere: spiky seed 0 misses by $0.11 (5 %), other seeds and
    the realistic world by up to a third (`benchmarks/placement_sim.py` has the figures) —
    machines rented on the dearer provider during the outage keep serving after it."""
    day = shipped_days[name]
    assert day.cost_holds(), (name, day.extra(), day.allowance())
