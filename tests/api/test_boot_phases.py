"""A machine's boot phases through the real API (SQLite and PostgreSQL): kept for its own row
only (its worker token, another machine's is a 403), unknown phases refused with the field
named, times clamped into [the boot's start, the store's now] beside the receive time, the first
report of a phase wins, a resume's phases marked as that resume. And the slow-host rule on the
heartbeat path: a cold boot over 3× its (provider, GPU) median avoids its host — written after
the request's transaction commits — while the agent's phase times move nothing."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update

from autoscaler.lifecycle import InstanceState as S
from autoscaler.policy.boots import BOOT_PHASES
from autoscaler.store import avoided_hosts, boot_phases, config_versions
from autoscaler.store.boot_phases import PhaseRecord
from autoscaler.store.models import Instance, ScaleEvent
from autoscaler.wire import BootPhases
from tests.api.apikit import CONFIG, World, add_machine, make_world


@pytest.fixture
def world(db_url, tmp_path) -> Iterator[World]:
    w = make_world(db_url, tmp_path)
    try:
        yield w
    finally:
        w.close()


def _place(world: World, launch_id: str, **values: object) -> None:
    with world.rt.transaction() as session:
        session.execute(update(Instance).where(Instance.launch_id == launch_id).values(**values))


def _phases(world: World, launch_id: str) -> dict[tuple[int, str], PhaseRecord]:
    with world.rt.transaction() as session:
        rows = boot_phases.of_launch(session, launch_id)
    return {(r.boot, r.phase): r for r in rows}


def test_the_body_names_every_phase_in_order():
    assert tuple(BootPhases.model_fields) == BOOT_PHASES


def test_phases_are_kept_once_clamped_with_the_rows_provider_gpu_and_host(world):
    created = datetime.now(UTC) - timedelta(minutes=10)
    _place(world, "m1", created_at=created, gpu="RTX 4090", host_id="host-7")
    tok = world.h(world.tokens["m1"])
    before = datetime.now(UTC)
    body = {
        "started": (created - timedelta(hours=3)).isoformat(),  # before its launch: clamped up
        "registered": (created + timedelta(minutes=1)).isoformat(),
        "code_fetched": (created + timedelta(minutes=2)).timestamp(),  # epoch seconds too
        "first_job": (datetime.now(UTC) + timedelta(days=2)).isoformat(),  # ahead: clamped down
    }
    r = world.client.post("/v1/worker/m1/phases", json=body, headers=tok)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "boot": 0,
        "resume": False,
        "recorded": ["started", "registered", "code_fetched", "first_job"],
    }
    after = datetime.now(UTC)
    got = _phases(world, "m1")
    assert set(got) == {(0, p) for p in ("started", "registered", "code_fetched", "first_job")}
    for p in got.values():
        # the row's provider, GPU, host and queue, never the machine's word
        assert (p.queue, p.provider, p.gpu, p.host_id) == ("q1", "sandbox", "RTX 4090", "host-7")
        assert before - timedelta(seconds=1) <= p.received_at <= after + timedelta(seconds=1)
        assert created - timedelta(seconds=1) <= p.at <= p.received_at
    assert abs((got[(0, "started")].at - created).total_seconds()) < 1
    assert abs((got[(0, "registered")].at - created - timedelta(minutes=1)).total_seconds()) < 1
    assert abs((got[(0, "code_fetched")].at - created - timedelta(minutes=2)).total_seconds()) < 1
    assert got[(0, "first_job")].at == got[(0, "first_job")].received_at

    # the first report wins: a second one changes nothing it already has, adds what it lacks
    again = {
        "started": (created + timedelta(minutes=5)).isoformat(),
        "worker_up": (created + timedelta(minutes=3)).isoformat(),
    }
    r = world.client.post("/v1/worker/m1/phases", json=again, headers=tok)
    assert r.status_code == 200 and r.json()["recorded"] == ["worker_up"]
    later = _phases(world, "m1")
    assert later[(0, "started")].at == got[(0, "started")].at
    assert later[(0, "started")].received_at == got[(0, "started")].received_at
    assert (0, "worker_up") in later


def test_a_machine_writes_its_own_rows_only(world):
    """Another machine's token cannot write (or overwrite) this machine's phases: 403, and
    nothing is kept for either machine; with its own id it writes its own rows alone."""
    at = datetime.now(UTC).isoformat()
    r = world.client.post(
        "/v1/worker/m1/phases", json={"started": at}, headers=world.h(world.tokens["m2"])
    )
    assert r.status_code == 403
    r = world.client.post(
        "/v1/worker/m1/phases", json={"started": at}, headers=world.h(world.tokens["gone"])
    )
    assert r.status_code == 401  # a machine no longer live: its token is dead
    assert _phases(world, "m1") == {} and _phases(world, "m2") == {}
    r = world.client.post(
        "/v1/worker/m2/phases", json={"started": at}, headers=world.h(world.tokens["m2"])
    )
    assert r.status_code == 200 and r.json()["recorded"] == ["started"]
    assert set(_phases(world, "m2")) == {(0, "started")} and _phases(world, "m1") == {}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"booted": "2026-12-01T10:00:00Z"}, "booted"),  # not a phase
        ({"started": "yesterday"}, "started"),
        ({"worker_up": "0001-01-01T00:00:00+14:00"}, "worker_up"),  # not a UTC time
        ({"phases": {"started": "2026-12-01T10:00:00Z"}}, "phases"),
    ],
)
def test_an_unknown_phase_or_a_bad_time_is_a_422_naming_the_field(world, body, field):
    r = world.client.post("/v1/worker/m1/phases", json=body, headers=world.h(world.tokens["m1"]))
    assert r.status_code == 422, r.text
    assert [d["field"] for d in r.json()["detail"]] == [field]
    assert _phases(world, "m1") == {}


def test_a_resumes_phases_are_that_resumes_and_clamped_to_its_start(world):
    created = datetime.now(UTC) - timedelta(hours=5)
    resumed = datetime.now(UTC) - timedelta(minutes=2)
    _place(world, "m1", created_at=created)
    tok = world.h(world.tokens["m1"])
    cold = (created + timedelta(minutes=1)).isoformat()
    assert world.client.post("/v1/worker/m1/phases", json={"started": cold}, headers=tok).json()[
        "recorded"
    ] == ["started"]
    _place(world, "m1", state=S.RESUMING, resumes=1, resuming_at=resumed)
    early = (resumed - timedelta(hours=1)).isoformat()  # before the resume: clamped up to it
    r = world.client.post(
        "/v1/worker/m1/phases", json={"started": early, "worker_up": early}, headers=tok
    )
    assert r.status_code == 200
    assert r.json() == {"boot": 1, "resume": True, "recorded": ["started", "worker_up"]}
    got = _phases(world, "m1")
    assert set(got) == {(0, "started"), (1, "started"), (1, "worker_up")}
    assert abs((got[(1, "started")].at - resumed).total_seconds()) < 1
    assert abs((got[(0, "started")].at - created - timedelta(minutes=1)).total_seconds()) < 1


# ------------------------------------------------------------------ the slow-host rule

VAST = "gpu-vast"
GPU = "RTX 4090"


def _with_vast(world: World) -> None:
    """A config version with a Vast provider (its key from the env; nothing calls it)."""
    doc = copy.deepcopy(CONFIG)
    doc["providers"][VAST] = {
        "kind": "vast",
        "base_url": "http://127.0.0.1:9",
        "api_key_env": "BOOT_TEST_VAST_KEY",
        "avoid_host_for": 7200,
    }
    world.rt.env = {**world.rt.env, "BOOT_TEST_VAST_KEY": "vast_not_a_real_key"}
    with world.rt.transaction() as session:
        config_versions.record(session, doc, "test", datetime.now(UTC), "vast")


def _earlier_boots(world: World, n: int, seconds: float) -> None:
    now = datetime.now(UTC)
    for i in range(n):
        lid = f"early{i}"
        add_machine(world.rt, lid, S.TERMINATED)
        created = now - timedelta(hours=1 + i)
        _place(
            world,
            lid,
            provider=VAST,
            gpu=GPU,
            host_id=f"h{i}",
            created_at=created,
            ready_at=created + timedelta(seconds=seconds + i),
        )


def _booting(world: World, launch_id: str, took: float, host: str) -> dict[str, str]:
    token = add_machine(world.rt, launch_id, S.BOOTING)
    created = datetime.now(UTC) - timedelta(seconds=took)
    _place(world, launch_id, provider=VAST, gpu=GPU, host_id=host, created_at=created)
    return world.h(token)


def _slow_events(world: World) -> list[ScaleEvent]:
    with world.rt.transaction() as session:
        rows = session.scalars(
            select(ScaleEvent).where(ScaleEvent.kind == "boot", ScaleEvent.action == "slow_host")
        ).all()
        for r in rows:
            session.expunge(r)
        return list(rows)


def test_a_slow_cold_boot_avoids_its_host_after_the_heartbeat_commits(world):
    _with_vast(world)
    _earlier_boots(world, 5, 100.0)  # 100..104 s
    fast = _booting(world, "fast", 250.0, "host-ok")  # under 3 × 102 s: its host is fine
    slow = _booting(world, "slow", 400.0, "host-slow")
    # what the machine says of its phases moves nothing: an early "worker_up" is display only
    world.client.post(
        "/v1/worker/slow/phases",
        json={"worker_up": (datetime.now(UTC) - timedelta(seconds=390)).isoformat()},
        headers=slow,
    )
    r = world.client.post("/v1/worker/fast/heartbeat", json={"state": "idle"}, headers=fast)
    assert r.json()["state"] == "ready"
    started = time.monotonic()
    r = world.client.post("/v1/worker/slow/heartbeat", json={"state": "idle"}, headers=slow)
    # a write on a second connection while the request's own is open would wait on SQLite's
    # lock (30 s), then fail: the host is avoided after the commit
    assert time.monotonic() - started < 10
    assert r.status_code == 200 and r.json()["state"] == "ready"
    now = datetime.now(UTC)
    with world.rt.transaction() as session:
        assert avoided_hosts.active_host_ids(session, VAST, now) == ["host-slow"]
        from autoscaler.store.models import AvoidedHost

        entry = session.get(AvoidedHost, (VAST, "host-slow"))
        assert entry is not None
        assert "slow boot on host host-slow" in entry.reason and "3×" in entry.reason
        assert timedelta(minutes=119) < entry.until - now <= timedelta(minutes=120)
        # it expires like any avoided host
        assert avoided_hosts.active_host_ids(session, VAST, now + timedelta(hours=3)) == []
    (e,) = _slow_events(world)
    assert e.launch_id == "slow" and e.queue == "q1"
    assert e.details is not None
    # judged against the six boots before it (the fast one too): median 102.5 s
    assert e.details["host"] == "host-slow" and e.details["samples"] == 6
    assert e.details["median_seconds"] == pytest.approx(102.5)
    assert e.details["seconds"] == pytest.approx(400.0, abs=5)


def test_too_few_earlier_boots_judge_nothing(world):
    _with_vast(world)
    _earlier_boots(world, 4, 100.0)
    slow = _booting(world, "slow", 1000.0, "host-slow")
    r = world.client.post("/v1/worker/slow/heartbeat", json={"state": "idle"}, headers=slow)
    assert r.json()["state"] == "ready"
    with world.rt.transaction() as session:
        assert avoided_hosts.active_host_ids(session, VAST, datetime.now(UTC)) == []
    assert _slow_events(world) == []


def test_boot_times_in_the_overview_and_metrics_are_status_numbers(world):
    _earlier_boots(world, 5, 100.0)  # gpu-vast / RTX 4090: 100..104 s
    r = world.client.get("/v1/admin/overview", headers=world.h(world.admin))
    assert r.status_code == 200, r.text
    assert r.json()["boots"] == [
        {
            "provider": VAST,
            "gpu": GPU,
            "median_seconds": 102.0,
            "p90_seconds": 104.0,
            "samples": 5,
        }
    ]
    text = world.client.get("/metrics").text
    assert f'autoscaler_boot_seconds{{gpu="{GPU}",provider="{VAST}",quantile="0.5"}} 102.0' in text
    assert f'autoscaler_boot_seconds{{gpu="{GPU}",provider="{VAST}",quantile="0.9"}} 104.0' in text
    assert f'autoscaler_boot_samples{{gpu="{GPU}",provider="{VAST}"}} 5.0' in text
