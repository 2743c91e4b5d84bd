"""Property tests of reconcile(): random rows in every state against random provider views."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.config import load_config_text
from autoscaler.config.models import Config
from autoscaler.lifecycle import ALLOWED_TRANSITIONS, LIVE_STATES, InstanceState, MachineStatus
from autoscaler.policy.reconcile import (
    ORPHAN_GRACE,
    Listed,
    ProviderView,
    ReconcilePlan,
    Row,
    reconcile,
)
from autoscaler.policy.warm import spec_key

from .helpers import PROVIDERS

S = InstanceState
M = MachineStatus
NOW = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)
PROVIDER_NAMES = ("a", "b", "c")  # "c" never has a view: its list is unknown


def _config(
    poll: float, heartbeat: float, boot: float, queue_boot: float | None, pool: int = 0
) -> Config:
    def queue(boot_override: float | None) -> dict[str, Any]:
        auto: dict[str, Any] = {
            "provider": "gpu",
            "max_workers": 4,
            "instance": {"gpu": "x", "max_price_per_hour": 0.5},
            "warm_pool": {"size": pool, "keep_for": "1h", "resume_timeout": "2m"},
        }
        if boot_override is not None:
            auto["boot_timeout"] = boot_override
        return {"autoscale": auto}

    doc = {
        "poll_interval": poll,
        "heartbeat_timeout": heartbeat,
        "boot_timeout": boot,
        "queues": {"q": queue(None), "r": queue(queue_boot)},
    }
    return load_config_text(yaml.safe_dump(doc), registered_providers=PROVIDERS)


CONFIGS = [
    _config(30, 300, 900, None),
    _config(10, 120, 600, 60, pool=2),
    _config(60, 60, 300, 1200, pool=1),
    _config(5, 600, 120, 30),
]
FIT = spec_key(CONFIGS[0].queues["q"].autoscale)  # every queue rents this spec


def label(lid: str) -> str:
    return f"asg-inst-{lid}"


@st.composite
def worlds(draw):
    cfg = draw(st.sampled_from(CONFIGS))
    secs = st.floats(0, 4000, allow_nan=False) | st.sampled_from(
        [0.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1200.0]
    )
    rows: list[Row] = []
    for i in range(draw(st.integers(0, 8))):
        # every state, the serving ones more often (that is where busy workers are)
        state = draw(st.sampled_from([*S, S.BOOTING, S.READY, S.READY, S.DRAINING]))
        provider = draw(st.sampled_from(PROVIDER_NAMES))
        pid = draw(st.sampled_from([None, f"p{i}", f"p{i}"]))
        recent = st.floats(0, 60, allow_nan=False)
        seen = draw(st.one_of(st.none(), secs, recent, recent))
        rows.append(
            Row(
                launch_id=f"L{i}",
                queue=draw(st.sampled_from(["q", "r", "unconfigured"])),
                provider=provider,
                state=state,
                since=NOW - timedelta(seconds=draw(secs)),
                provider_instance_id=pid,
                host_id=draw(st.sampled_from([None, f"h{i}"])),
                last_seen_at=None if seen is None else NOW - timedelta(seconds=seen),
                running_tasks=draw(st.sampled_from([0, 1, 3])),
                remote_control=draw(st.booleans()),
                silence_noted_at=draw(
                    st.none() | st.floats(0, 600).map(lambda x: NOW - timedelta(seconds=x))
                ),
                keep_warm=draw(st.booleans()),
                spec_key=draw(st.sampled_from([FIT, FIT, "another spec", None])),
            )
        )
    views: dict[str, ProviderView] = {}
    for name in PROVIDER_NAMES[:2]:
        if not draw(st.booleans()) and draw(st.booleans()):
            continue  # sometimes no view at all
        machines: list[Listed] = []
        for r in rows:
            if r.provider != name or draw(st.integers(0, 2)) == 0:
                continue
            status = draw(st.sampled_from(list(M)))
            pid = r.provider_instance_id or f"x{r.launch_id}"
            machines.append(Listed(pid, r.launch_id, label(r.launch_id), status, r.host_id))
            if draw(st.integers(0, 3)) == 0:  # a second machine for the same launch
                status = draw(st.sampled_from(list(M)))
                machines.append(Listed(f"s{r.launch_id}", r.launch_id, label(r.launch_id), status))
        # extra labelled machines: unknown launches, launches of rows elsewhere, second machines
        lids = [r.launch_id for r in rows] + ["X1", "X2"]
        for j in range(draw(st.integers(0, 4))):
            lid = draw(st.sampled_from(lids))
            status = draw(st.sampled_from(list(M)))
            machines.append(Listed(f"e{name}{j}", lid, label(lid), status, None))
        machines = draw(st.permutations(machines))
        views[name] = ProviderView(
            name,
            listed=draw(st.sampled_from([True, True, False])),
            machines=tuple(machines),
            ready_when_running=draw(st.booleans()),
        )
    keys: list[tuple[str, str]] = [
        (name, m.provider_instance_id) for name, v in views.items() for m in v.machines
    ] + [("a", "old1"), ("c", "old2")]
    orphans_seen = {
        key: (f"asg-inst-{key[1]}", NOW - timedelta(seconds=draw(secs)))
        for key in draw(st.lists(st.sampled_from(keys), unique=True, max_size=5))
    }
    return tuple(rows), views, orphans_seen, cfg


def _list_read(views: dict[str, ProviderView], provider: str) -> bool:
    v = views.get(provider)
    return v is not None and v.listed


def _own_machines(row: Row, views: dict[str, ProviderView]) -> list[Listed]:
    """The machines at the row's provider that are the row's own (not a second one)."""
    v = views[row.provider]
    return [
        m
        for m in v.machines
        if m.launch_id == row.launch_id
        and m.status != M.GONE
        and row.provider_instance_id in (None, m.provider_instance_id)
    ]


SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(world) -> tuple[ReconcilePlan, dict[str, Row]]:
    rows, views, seen, cfg = world
    plan = reconcile(rows, views, seen, cfg, NOW)
    assert reconcile(rows, views, seen, cfg, NOW) == plan  # deterministic
    return plan, {r.launch_id: r for r in rows}


@SETTINGS
@given(worlds())
def test_every_move_is_an_allowed_transition_from_the_rows_current_state(world):
    plan, by_id = run(world)
    for t in plan.transitions:
        r = by_id[t.launch_id]
        assert t.src == r.state
        assert t.dst in ALLOWED_TRANSITIONS[r.state], (r.state, t.dst)
        assert (t.queue, t.provider) == (r.queue, r.provider)
    for retry in plan.retries:
        r = by_id[retry.launch_id]
        expected = {
            S.PENDING: "launch",
            S.DRAINING: "drain",
            S.TERMINATING: "terminate",
            S.STOPPING: "stop",
            S.RESUMING: "resume",
        }
        assert expected.get(r.state) == retry.step, (r.state, retry.step)
        assert retry.queue == r.queue


@SETTINGS
@given(worlds())
def test_at_most_one_action_per_row(world):
    plan, _ = run(world)
    acted = Counter([t.launch_id for t in plan.transitions] + [r.launch_id for r in plan.retries])
    assert all(n == 1 for n in acted.values()), acted


@SETTINGS
@given(worlds())
def test_nothing_that_depends_on_a_list_happens_when_that_list_failed(world):
    _rows, views, seen, _cfg = world
    plan, _by_id = run(world)
    for t in plan.transitions:
        if _list_read(views, t.provider):
            continue
        assert t.dst not in (S.LOST, S.TERMINATED), t
        assert not (t.src == S.CREATING and t.dst == S.FAILED), t
        assert not (t.src == S.CREATING and t.dst == S.BOOTING), t  # adoption needs the list
    for d in plan.destroys:
        assert _list_read(views, d.provider), d
    # what was known of an unread provider's orphans is kept as it was
    assert plan.orphans is not None
    for key, value in seen.items():
        if key[0] in views and not views[key[0]].listed:
            assert plan.orphans.get(key) == value


@SETTINGS
@given(worlds())
def test_an_orphan_is_never_destroyed_before_the_grace_since_its_first_sighting(world):
    _rows, views, seen, _cfg = world
    plan, _ = run(world)
    assert plan.orphans is not None
    for d in plan.destroys:
        key = (d.provider, d.provider_instance_id)
        first = seen[key][1] if key in seen else NOW
        assert (NOW - first).total_seconds() >= ORPHAN_GRACE, d
        assert plan.orphans[key][1] == first  # the first sighting is carried, not reset
        listed = [m for m in views[d.provider].machines if m.provider_instance_id == key[1]]
        assert listed and all(m.status != M.GONE for m in listed)
    for key, (_, first) in plan.orphans.items():
        assert first == (seen[key][1] if key in seen else NOW)
    # every orphan past its grace at a listed provider is destroyed
    for key, (_, first) in plan.orphans.items():
        if _list_read(views, key[0]) and (NOW - first).total_seconds() >= ORPHAN_GRACE:
            assert key in {(d.provider, d.provider_instance_id) for d in plan.destroys}


@SETTINGS
@given(worlds())
def test_a_machine_owned_by_a_live_row_is_never_destroyed_as_an_orphan(world):
    rows, views, _seen, _cfg = world
    plan, _ = run(world)
    owned = {
        (r.provider, m.provider_instance_id)
        for r in rows
        if r.state in LIVE_STATES and r.provider in views
        for m in views[r.provider].machines
        if m.launch_id == r.launch_id and r.provider_instance_id in (None, m.provider_instance_id)
    }
    assert plan.orphans is not None
    for d in plan.destroys:
        assert (d.provider, d.provider_instance_id) not in owned, d
    for key in owned:
        if _list_read(views, key[0]):
            assert key not in plan.orphans


@SETTINGS
@given(worlds())
def test_the_orphans_of_a_listed_provider_are_exactly_the_machines_no_live_row_owns(world):
    """No row, a final row, a row of another provider, or a row owning another machine."""
    rows, views, _seen, _cfg = world
    plan, _ = run(world)

    def owned(provider: str, m: Listed) -> bool:
        return any(
            r.launch_id == m.launch_id
            and r.provider == provider
            and r.state in LIVE_STATES
            and r.provider_instance_id in (None, m.provider_instance_id)
            for r in rows
        )

    expected = {
        (name, m.provider_instance_id)
        for name, v in views.items()
        if v.listed
        for m in v.machines
        if m.status != M.GONE and not owned(name, m)
    }
    assert plan.orphans is not None
    assert {k for k in plan.orphans if _list_read(views, k[0])} == expected


@SETTINGS
@given(worlds(), st.randoms(use_true_random=False))
def test_the_order_of_rows_does_not_change_the_plan(world, rnd: random.Random):
    rows, views, seen, cfg = world
    plan, _ = run(world)
    shuffled = list(rows)
    rnd.shuffle(shuffled)
    other = reconcile(tuple(shuffled), views, seen, cfg, NOW)
    assert set(other.transitions) == set(plan.transitions)
    assert set(other.retries) == set(plan.retries)
    assert set(other.destroys) == set(plan.destroys)
    assert other.orphans == plan.orphans


@st.composite
def busy_worlds(draw):
    """A random world plus one busy worker seen recently at provider "a", its own machine listed
    alive (or the list failed), maybe next to second machines for the same launch."""
    rows, views, seen, cfg = draw(worlds())
    state = draw(st.sampled_from([S.READY, S.DRAINING, S.BOOTING]))
    since = draw(st.floats(0, 4000, allow_nan=False))
    seen_ago = draw(st.floats(0, cfg.heartbeat_timeout, exclude_max=True, allow_nan=False))
    if state == S.BOOTING:
        seen_ago = min(seen_ago, since)  # seen since it entered booting
    busy = Row(
        "B",
        draw(st.sampled_from(["q", "r"])),
        "a",
        state,
        NOW - timedelta(seconds=since),
        provider_instance_id="pB",
        host_id=draw(st.sampled_from([None, "hB"])),
        last_seen_at=NOW - timedelta(seconds=seen_ago),
        running_tasks=draw(st.integers(1, 4)),
    )
    old = views.get("a", ProviderView("a", listed=True))
    machines = list(old.machines)
    ours = [Listed("pB", "B", label("B"), draw(st.sampled_from([M.STARTING, M.RUNNING])))]
    ours += [
        Listed(f"sB{k}", "B", label("B"), draw(st.sampled_from(list(M))))
        for k in range(draw(st.integers(0, 2)))
    ]
    for m in ours:
        machines.insert(draw(st.integers(0, len(machines))), m)
    views = {
        **views,
        "a": ProviderView(
            "a",
            listed=draw(st.booleans()),
            machines=tuple(machines),
            ready_when_running=old.ready_when_running,
        ),
    }
    return (*rows, busy), views, seen, cfg


@SETTINGS
@given(busy_worlds())
def test_a_busy_worker_seen_recently_is_never_destroyed_unless_dead_or_missing(world):
    """A worker that reported running tasks and was seen within the heartbeat timeout, whose own
    machine is neither dead nor missing at its provider, is never sent to TERMINATING (a second
    machine listed for the same launch is not its machine)."""
    _rows, views, _seen, cfg = world
    plan, by_id = run(world)
    for t in plan.transitions:
        if t.dst != S.TERMINATING:
            continue
        r = by_id[t.launch_id]
        seen_at = r.last_seen_at
        if r.running_tasks == 0 or seen_at is None:
            continue
        if (NOW - seen_at).total_seconds() >= cfg.heartbeat_timeout:
            continue  # silent
        if r.state == S.BOOTING and seen_at < r.since:
            continue  # a sign of life from before it booted says nothing about this boot
        if r.state not in (S.BOOTING, S.READY, S.DRAINING):
            continue  # drained: its worker finished
        if _list_read(views, r.provider):
            own = _own_machines(r, views)
            if not own or any(m.status in (M.DEAD, M.STOPPED) for m in own):
                continue  # missing or dead at the provider
        raise AssertionError(f"busy worker {r} sent to TERMINATING: {t.reason}")


@SETTINGS
@given(worlds(), st.data())
def test_a_second_machine_for_a_launch_never_decides_its_rows_fate(world, data):
    """A machine carrying a row's label but not the row's provider instance id is an orphan
    ("a second machine for launch ..."): whether it is listed, and in which status, must not
    change what happens to the row (its own machine decides)."""
    rows, views, seen, cfg = world
    candidates = [
        r
        for r in rows
        if r.provider_instance_id is not None
        and r.provider in views
        and r.state in (S.BOOTING, S.READY, S.DRAINING, S.DRAINED, S.TERMINATING)
    ]
    if not candidates:
        return
    r = data.draw(st.sampled_from(candidates))
    v = views[r.provider]
    alone = [
        m
        for m in v.machines
        if m.launch_id != r.launch_id or m.provider_instance_id == r.provider_instance_id
    ]
    crowded = list(alone)
    for k in range(data.draw(st.integers(1, 2))):
        status = data.draw(st.sampled_from(list(M)))
        second = Listed(f"second{k}", r.launch_id, label(r.launch_id), status)
        crowded.insert(data.draw(st.integers(0, len(crowded))), second)

    def actions(machines: list[Listed]) -> tuple[object, ...]:
        vs = {
            **views,
            r.provider: ProviderView(r.provider, v.listed, tuple(machines), v.ready_when_running),
        }
        plan = reconcile(rows, vs, seen, cfg, NOW)
        return tuple(a for a in (*plan.transitions, *plan.retries) if a.launch_id == r.launch_id)

    assert actions(crowded) == actions(alone), (r, crowded)


@SETTINGS
@given(worlds())
def test_a_worker_only_remote_control_sees_is_never_destroyed_for_silence_on_a_running_machine(
    world,
):
    """However its last sighting read, a worker seen only through remote control (it may be a
    busy solo pool) whose own machine the provider lists as running is not destroyed for
    silence before drain_timeout."""
    _rows, views, _seen, cfg = world
    plan, by_id = run(world)
    for t in plan.transitions:
        r = by_id[t.launch_id]
        if t.dst != S.TERMINATING or not r.remote_control or "silent" not in t.reason:
            continue
        own = _own_machines(r, views) if _list_read(views, r.provider) else []
        if any(m.status == M.RUNNING for m in own):
            silent = (NOW - (r.last_seen_at or r.since)).total_seconds()
            assert silent >= max(cfg.heartbeat_timeout, cfg.drain_timeout), (r, t.reason)


@SETTINGS
@given(worlds())
def test_silence_destroys_only_a_machine_a_round_before_found_silent_too(world):
    """No machine goes for silence in the round that first finds it silent, nor in one racing
    that round, nor when its worker spoke after the earlier round noted it."""
    _rows, _views, _seen, cfg = world
    plan, by_id = run(world)
    for t in plan.transitions:
        if t.dst != S.TERMINATING or "silent" not in t.reason:
            continue
        r = by_id[t.launch_id]
        noted = r.silence_noted_at
        assert noted is not None and noted <= NOW, (r, t.reason)
        assert (NOW - noted).total_seconds() >= 0.5 * cfg.poll_interval, (r, t.reason)
        assert r.last_seen_at is None or r.last_seen_at <= noted, (r, t.reason)
