"""`autoscaler status / instances / events` on a migrated store the test fills (PostgreSQL and
SQLite): the tables an operator reads and the numbers `--json` gives scripts, costs at the
machines' real prices (not the queues' caps)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from autoscaler.cli import common, main
from autoscaler.lifecycle import InstanceState as S
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.models import (
    ConfigVersion,
    Instance,
    ManualTargetRow,
    MetricReading,
    QueueStatus,
    RentalBackoff,
    ScaleEvent,
)

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)

# launch id -> (queue, state, gpu, real $/h, created, booting_at, ready_at, end, running, last task)
MACHINES = {
    "aaaa0000busy": (
        "inference",
        S.READY,
        "RTX 4090",
        0.35,
        125 * M,
        2 * H,
        110 * M,
        None,
        2,
        None,
    ),
    "bbbb0000idle": (
        "inference",
        S.READY,
        "RTX 4090",
        0.40,
        31 * M,
        30 * M,
        25 * M,
        None,
        0,
        10 * M,
    ),
    "cccc0000boot": ("inference", S.BOOTING, "RTX 3090", 0.50, 4 * M, 3 * M, None, None, 0, None),
    "dddd0000pend": ("inference", S.PENDING, None, None, 1 * M, None, None, None, 0, None),
    "eeee0000drai": ("batch", S.DRAINING, "A100", 1.20, 61 * M, 1 * H, 55 * M, None, 1, None),
    "ffff0000gone": ("batch", S.TERMINATED, "A100", 0.30, 13 * H, 13 * H, 12 * H, 11 * H, 0, None),
    "9999000unknw": ("batch", S.READY, "L4", None, 6 * M, 5 * M, 4 * M, None, 0, None),
}
# cost so far = real price × hours since booting_at (to its end, or now)
COST = {
    "aaaa0000busy": 0.35 * 2,
    "bbbb0000idle": 0.40 * 0.5,
    "cccc0000boot": 0.50 * 3 / 60,
    "dddd0000pend": 0.0,
    "eeee0000drai": 1.20 * 1,
    "ffff0000gone": 0.30 * 2,
}
RATE = 0.35 + 0.40 + 0.50 + 1.20  # machines that may bill, known price
TODAY = 0.70 + 0.20 + 0.025 + 1.20 + 0.30  # the terminated one billed 00:00-01:00 today


def _fill(url: str) -> None:
    engine = make_engine(url)
    try:
        with transaction(session_factory(engine)) as s:
            s.add(
                ConfigVersion(
                    version=3,
                    changed_by="alice",
                    changed_at=NOW - 2 * H,
                    document={
                        "queues": {
                            "inference": {"metrics": {"source": "celery"}, "autoscale": {}},
                            "batch": {
                                "metrics": {"source": "celery", "queue": "batch-jobs"},
                                "autoscale": {},
                            },
                            "cpu-only": {"metrics": {"source": "celery"}, "autoscale": None},
                        }
                    },
                )
            )
            for lid, (q, st, gpu, price, created, boot, ready, end, run, task) in MACHINES.items():
                s.add(
                    Instance(
                        launch_id=lid,
                        queue=q,
                        provider="gpu-vast" if q == "inference" else "gpu-runpod",
                        state=st,
                        gpu=gpu,
                        price_per_hour=price,
                        offer={"price_per_hour": 0.60},  # the cap: never what is charged
                        provider_instance_id=f"p-{lid[:4]}" if boot else None,
                        created_at=NOW - created,
                        pending_at=NOW - created,
                        booting_at=NOW - boot if boot else None,
                        ready_at=NOW - ready if ready else None,
                        terminated_at=NOW - end if end else None,
                        draining_at=NOW - 2 * M if st == S.DRAINING else None,
                        running_tasks=run,
                        last_task_at=NOW - task if task else None,
                        updated_at=NOW - (end or M),
                    )
                )
            s.add_all(
                [
                    QueueStatus(
                        queue="inference",
                        evaluated_at=NOW - 4 * timedelta(seconds=1),
                        config_version=3,
                        status={
                            "queue": "inference",
                            "capacity": 3,
                            "floor": 0,
                            "ceiling": 4,
                            "desired": 4,
                            "waits": [
                                {
                                    "kind": "backoff",
                                    "machines": 1,
                                    "reason": "gpu-vast backs off after 3 failed rentals",
                                    "until": (NOW + 5 * M).isoformat(),
                                }
                            ],
                            "notes": ["queue_depth: 12 pending / 4 per worker → 3 machines"],
                        },
                    ),
                    QueueStatus(
                        queue="batch",
                        evaluated_at=NOW - 4 * timedelta(seconds=1),
                        config_version=3,
                        status={
                            "queue": "batch",
                            "capacity": 1,
                            "floor": 2,
                            "ceiling": 2,
                            "desired": 2,
                            "waits": [],
                            "notes": ["manual target 2 (alice)"],
                        },
                    ),
                    RentalBackoff(
                        queue="inference",
                        provider="gpu-vast",
                        failures=3,
                        until=NOW + 5 * M,
                        last_error="no offer under $0.60/h",
                    ),
                    RentalBackoff(  # expired: not shown
                        queue="batch", provider="gpu-runpod", failures=1, until=NOW - M
                    ),
                    ManualTargetRow(
                        queue="batch", workers=2, until=NOW + H, set_by="alice", set_at=NOW - M
                    ),
                    ManualTargetRow(  # expired: not shown
                        queue="inference", workers=9, until=NOW - M, set_by="bob", set_at=NOW - H
                    ),
                    MetricReading(
                        source="celery:redis://127.0.0.1:6379/0",
                        queue="inference",
                        reading={
                            "queue": "inference",
                            "pending": 12,
                            "oldest_pending_age": 240.0,
                            "in_flight": 1,
                            "running": 2,
                            "scheduled": 0,
                            "read_at": (NOW - 5 * timedelta(seconds=1)).isoformat(),
                            "stale": False,
                        },
                        read_at=NOW - 5 * timedelta(seconds=1),
                    ),
                    MetricReading(
                        source="celery:redis://127.0.0.1:6379/0",
                        queue="batch-jobs",
                        reading={
                            "queue": "batch-jobs",
                            "pending": 0,
                            "oldest_pending_age": None,
                            "in_flight": 0,
                            "read_at": (NOW - 65 * timedelta(seconds=1)).isoformat(),
                            "stale": True,
                            "error": "Redis timed out",
                        },
                        read_at=NOW - 65 * timedelta(seconds=1),
                    ),
                ]
            )
            events = [
                (3 * H, "inference", "scale_up", "launch", "aaaa0000busy", "12 pending > 10"),
                (2 * H, "inference", "launch", "created", "aaaa0000busy", "gpu-vast rented p-aaaa"),
                (50 * M, "batch", "manual", "scale", None, "alice pinned batch at 2 worker(s)"),
                (10 * M, "inference", "wait", "backoff", None, "gpu-vast backs off"),
                (2 * M, "batch", "scale_down", "drain", "eeee0000drai", "idle for 10m"),
            ]
            for ago, q, kind, action, lid, reason in events:
                s.add(
                    ScaleEvent(
                        at=NOW - ago,
                        queue=q,
                        kind=kind,
                        action=action,
                        launch_id=lid,
                        reason=reason,
                    )
                )
    finally:
        engine.dispose()


@pytest.fixture
def cli(db_url, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "now", lambda: NOW)
    env = {
        "AUTOSCALER_HOME": str(tmp_path / "home"),
        "AUTOSCALER_DATABASE_URL": db_url,
        "AUTOSCALER_BROKER_URL": "redis://:s3cret-pw@127.0.0.1:6379/15",
    }
    runner = CliRunner()

    def run(*args: str, **extra: str):
        return runner.invoke(main, list(args), env={**env, **extra})

    upgraded = run("db", "upgrade")
    assert upgraded.exit_code == 0, upgraded.output
    _fill(db_url)
    return run


def _row(output: str, first: str) -> list[str]:
    for line in output.splitlines():
        if line.split()[:1] == [first]:
            return line.split()
    raise AssertionError(f"no row {first!r} in:\n{output}")


def test_status_table_shows_queues_machines_and_spend(cli):
    out = cli("status")
    assert out.exit_code == 0, out.output
    text = out.output
    assert "config v3" in text
    assert "embedded broker" not in text
    assert "s3cret-pw" not in text
    # QUEUE PENDING OLDEST LIVE BUSY BOOTING DRAINING DESIRED MANUAL… BACKOFF… SPEND
    inference = _row(text, "inference")
    assert inference[:8] == ["inference", "12", "4m05s", "2", "1", "2", "0", "4"]
    assert "auto" in inference and "gpu-vast" in inference and "×3" in inference
    assert inference[-1] == "$1.25/h"  # 0.35 + 0.40 + 0.50 (the pending row bills nothing)
    batch = _row(text, "batch")
    assert batch[:8] == ["batch", "0", "—", "1", "0", "0", "1", "2"]
    assert "2 for 1h00m (alice)" in " ".join(batch)
    assert batch[-1] == "$1.20/h"  # the draining A100; the L4's price is unknown
    assert _row(text, "cpu-only")[:2] == ["cpu-only", "—"]
    # why, backoff and manual target in words
    assert "desired 4 (capacity 3, floor 0, ceiling 4; evaluated 11:59:56)" in text
    assert "why: gpu-vast backs off after 3 failed rentals" in text
    assert "why: queue_depth: 12 pending / 4 per worker → 3 machines" in text
    assert "backoff: gpu-vast after 3 failure(s), no launch until 12:05:00: no offer" in text
    assert "manual target: 2 worker(s) until 13:00:00, set by alice" in text
    assert "read 1m05s ago (stale: last good numbers; Redis timed out)" in text
    assert "bob" not in text  # the expired target
    assert "not autoscaled" in text
    # machines: INSTANCE QUEUE PROVIDER GPU(2 words) STATE WORK AGE $/H COST
    busy = _row(text, "aaaa0000busy")
    assert busy[:6] == ["aaaa0000busy", "inference", "gpu-vast", "RTX", "4090", "ready"]
    assert busy[6:] == ["busy", "(2)", "2h05m", "$0.350", "$0.70"]
    idle = _row(text, "bbbb0000idle")
    assert idle[6:] == ["idle", "10m00s", "31m00s", "$0.400", "$0.20"]
    assert _row(text, "cccc0000boot")[-2:] == ["$0.500", "$0.03"]
    assert _row(text, "dddd0000pend")[-4:] == ["—", "1m00s", "?", "$0.00"]  # bills nothing yet
    assert _row(text, "eeee0000drai")[-2:] == ["$1.200", "$1.20"]
    assert _row(text, "9999000unknw")[-2:] == ["?", "?"]
    assert "ffff0000gone" not in text  # closed machines are not in status
    assert (
        "spend: $2.45/h now; today $2.42 (since 00:00 UTC, at the machines' real prices) "
        "(1 machine(s) of unknown price not counted)" in text
    )


def test_status_json_numbers(cli):
    out = cli("status", "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["config_version"] == 3
    assert doc["notes"] == [] and doc["control_broker"]["embedded"] is False
    assert "s3cret-pw" not in out.output
    q = {x["queue"]: x for x in doc["queues"]}
    assert set(q) == {"inference", "batch", "cpu-only"}
    inf = q["inference"]
    assert inf["pending"] == 12 and inf["oldest_age_seconds"] == pytest.approx(245)
    assert inf["running"] == 2
    assert inf["workers"] == {"live": 2, "busy": 1, "booting": 2, "draining": 0}
    assert (inf["desired"], inf["capacity"], inf["floor"], inf["ceiling"]) == (4, 3, 0, 4)
    assert inf["why"][0] == "gpu-vast backs off after 3 failed rentals"
    assert inf["backoffs"] == [
        {
            "provider": "gpu-vast",
            "failures": 3,
            "until": (NOW + 5 * M).isoformat(),
            "last_error": "no offer under $0.60/h",
            "cause": None,  # a backoff written before causes were kept
        }
    ]
    assert inf["providers"] == []  # one provider: no per-provider states
    assert inf["manual_target"] is None
    assert inf["spend_per_hour"] == pytest.approx(1.25)
    batch = q["batch"]
    assert batch["pending"] == 0 and batch["reading_stale"] is True
    assert batch["manual_target"] == {
        "workers": 2,
        "until": (NOW + H).isoformat(),
        "set_by": "alice",
    }
    assert batch["backoffs"] == []
    assert q["cpu-only"]["autoscaled"] is False and q["cpu-only"]["pending"] is None
    machines = {m["launch_id"]: m for m in doc["instances"]}
    assert set(machines) == set(MACHINES) - {"ffff0000gone"}
    for lid, cost in COST.items():
        if lid in machines:
            assert machines[lid]["cost_so_far"] == pytest.approx(cost), lid
    assert machines["dddd0000pend"]["cost_so_far"] == 0
    assert machines["dddd0000pend"]["billed_seconds"] == 0
    assert machines["9999000unknw"]["cost_so_far"] is None
    assert machines["aaaa0000busy"]["busy"] is True
    assert machines["aaaa0000busy"]["price_per_hour"] == 0.35  # real, not the 0.60 cap
    assert machines["bbbb0000idle"]["idle_seconds"] == pytest.approx(600)
    assert doc["spend"] == {
        "rate_per_hour": pytest.approx(RATE),
        "today": pytest.approx(TODAY),
        "unknown_price": 1,
        "day_start": "2026-11-30T00:00:00+00:00",
    }


def test_status_of_one_queue(cli):
    out = cli("status", "--queue", "batch")
    assert out.exit_code == 0, out.output
    assert _row(out.output, "batch")[:3] == ["batch", "0", "—"]
    assert "inference" not in out.output and "aaaa0000busy" not in out.output
    assert "eeee0000drai" in out.output
    assert "spend: $2.45/h now" in out.output  # the account's spend
    doc = json.loads(cli("status", "--queue", "batch", "--json").output)
    assert [q["queue"] for q in doc["queues"]] == ["batch"]
    assert {m["launch_id"] for m in doc["instances"]} == {"eeee0000drai", "9999000unknw"}
    assert "no queue named 'nope'" in cli("status", "--queue", "nope").output


def test_status_on_the_embedded_broker_says_what_to_use_instead(cli, tmp_path):
    broker = f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    out = cli("status", AUTOSCALER_BROKER_URL=broker)
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "embedded broker" in text
    assert "remote control cannot reach its workers" in text
    assert "autoscaler scale" in text and "celery -A autoscaler call" in text
    doc = json.loads(cli("status", "--json", AUTOSCALER_BROKER_URL=broker).output)
    assert doc["control_broker"]["embedded"] is True
    assert "remote control" in doc["notes"][0]


def test_status_watch_refreshes(cli):
    out = cli("status", "--json", "--watch", "--interval", "0.5", "--iterations", "2")
    assert out.exit_code == 0, out.output
    docs = [json.loads(line) for line in out.output.splitlines() if line.strip()]
    assert len(docs) == 2 and docs[0]["spend"] == docs[1]["spend"]
    table = cli("status", "--watch", "--interval", "0.5", "--iterations", "2")
    assert table.exit_code == 0
    assert table.output.count("autoscaler status at") == 2


def test_instances_filters_and_all(cli):
    live = cli("instances")
    assert live.exit_code == 0, live.output
    assert "ffff0000gone" not in live.output and "aaaa0000busy" in live.output
    every = json.loads(cli("instances", "--all", "--json").output)
    gone = next(m for m in every if m["launch_id"] == "ffff0000gone")
    assert gone["state"] == "terminated"
    assert gone["cost_so_far"] == pytest.approx(COST["ffff0000gone"])
    assert gone["billed_seconds"] == 7200
    batch = json.loads(cli("instances", "--queue", "batch", "--json").output)
    assert {m["launch_id"] for m in batch} == {"eeee0000drai", "9999000unknw"}
    booting = cli("instances", "--state", "booting", "--state", "pending")
    assert "cccc0000boot" in booting.output and "dddd0000pend" in booting.output
    assert "aaaa0000busy" not in booting.output
    assert "no machine matches" in cli("instances", "--queue", "nope").output


def test_events_table_and_filters(cli):
    out = cli("events")
    assert out.exit_code == 0, out.output
    lines = [line for line in out.output.splitlines() if line.startswith("2026-")]
    assert len(lines) == 5
    assert lines[0].split()[:6] == [
        "2026-11-30",
        "09:00:00",
        "inference",
        "scale_up",
        "launch",
        "aaaa0000busy",
    ]
    assert lines[0].endswith("12 pending > 10")
    assert lines[-1].split()[2:6] == ["batch", "scale_down", "drain", "eeee0000drai"]
    assert out.output.splitlines()[0].split()[:3] == ["AT", "(UTC)", "QUEUE"]

    def got(*args: str) -> list[str]:
        res = cli("events", "--json", *args)
        assert res.exit_code == 0, res.output
        return [e["reason"] for e in json.loads(res.output)]

    assert got("--queue", "batch") == ["alice pinned batch at 2 worker(s)", "idle for 10m"]
    assert got("--instance", "aaaa") == ["12 pending > 10", "gpu-vast rented p-aaaa"]
    assert got("--instance", "aaaa%") == []  # a prefix, not a pattern
    assert got("--kind", "manual", "--kind", "wait") == [
        "alice pinned batch at 2 worker(s)",
        "gpu-vast backs off",
    ]
    assert got("--kind", "drain") == ["idle for 10m"]  # an action matches too
    assert got("--since", "1h") == [
        "alice pinned batch at 2 worker(s)",
        "gpu-vast backs off",
        "idle for 10m",
    ]
    assert got("--since", "2026-11-30T09:30", "--until", "30m") == [
        "gpu-vast rented p-aaaa",
        "alice pinned batch at 2 worker(s)",
    ]
    assert got("--limit", "2") == ["gpu-vast backs off", "idle for 10m"]
    one = json.loads(cli("events", "--json", "--limit", "1").output)[0]
    assert one["at"] == (NOW - 2 * M).isoformat() and one["launch_id"] == "eeee0000drai"
    bad = cli("events", "--since", "yesterday-ish")
    assert bad.exit_code == 2 and "neither a duration" in bad.output


def test_status_refuses_a_store_that_is_not_set_up(tmp_path):
    res = CliRunner().invoke(
        main,
        ["status"],
        env={"AUTOSCALER_DATABASE_URL": f"sqlite:///{tmp_path / 'none.db'}"},
    )
    assert res.exit_code == 2 and "autoscaler db upgrade" in res.output


def test_status_reads_what_the_loop_and_the_sources_write(db_url, tmp_path, monkeypatch):
    """The rows written by the tick's own writers (queue_status from a real plan, the last good
    reading from a real QueueMetrics, a backoff and a manual target from the store's own
    writes), not hand-made dicts: the formats `status` reads are the ones the loop writes."""
    from autoscaler.config.models import Backoff
    from autoscaler.control import machines
    from autoscaler.control.tick.actions import StoreActions
    from autoscaler.policy.plan import QueuePlan, Wait
    from autoscaler.policy.snapshot import QueueMetrics
    from autoscaler.store import manual_targets, metric_readings

    monkeypatch.setattr(common, "now", lambda: NOW)
    env = {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": db_url}
    runner = CliRunner()
    assert runner.invoke(main, ["db", "upgrade"], env=env).exit_code == 0
    engine = make_engine(db_url)
    try:
        with transaction(session_factory(engine)) as s:
            metric_readings.save(
                s,
                "celery:redis://127.0.0.1:6379/0",
                {"gpu": QueueMetrics("gpu", 7, 90.0, 0, NOW - 10 * timedelta(seconds=1))},
            )

            class Loaded:
                version = 5

            actions = StoreActions(s, Loaded(), NOW - timedelta(seconds=2))  # type: ignore[arg-type]
            actions.queue_done(
                QueuePlan(
                    "gpu",
                    capacity=0,
                    floor=0,
                    ceiling=3,
                    desired=1,
                    up_fired=True,
                    waits=(Wait("gpu", "backoff", 1, "gpu-vast in backoff", NOW + 2 * M),),
                    notes=("no_workers: 7 pending, no machine",),
                )
            )
            actions.flush()
            machines.rental_failed(
                s, "gpu", "gpu-vast", NOW - 5 * timedelta(seconds=1), Backoff(), "offer gone"
            )
            manual_targets.put(s, "gpu", 1, NOW + H, "carol", NOW)
    finally:
        engine.dispose()
    res = runner.invoke(main, ["status", "--json"], env=env)
    assert res.exit_code == 0, res.output
    (q,) = json.loads(res.output)["queues"]
    assert q["queue"] == "gpu" and q["pending"] == 7
    assert q["oldest_age_seconds"] == pytest.approx(100)
    assert (q["desired"], q["capacity"], q["ceiling"]) == (1, 0, 3)
    assert q["why"] == ["gpu-vast in backoff", "no_workers: 7 pending, no machine"]
    assert q["backoffs"][0]["provider"] == "gpu-vast" and q["backoffs"][0]["failures"] == 1
    assert q["backoffs"][0]["last_error"] == "offer gone"  # 24-30 s from its failure: in force
    assert q["manual_target"]["set_by"] == "carol"
    text = runner.invoke(main, ["status"], env=env).output
    assert _row(text, "gpu")[:3] == ["gpu", "7", "1m40s"]
    events = runner.invoke(main, ["events", "--queue", "gpu", "--kind", "wait"], env=env).output
    assert "gpu-vast in backoff" in events
