"""`autoscale.max_lifetime`: the bound a machine's own word cannot hold off (#33, "A machine that
always says busy is never drained"). decide() drains a machine that served it, busy or not;
reconcile destroys one still draining `drain_timeout` after it; nothing changes without it."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
import yaml

from autoscaler.config import ConfigError, load_config_text
from autoscaler.lifecycle import InstanceState
from autoscaler.policy import decide
from autoscaler.policy.reconcile import Row, reconcile

from .helpers import NOW, PROVIDERS, config, metrics, ready, snap

S = InstanceState
BUSY_FOREVER = [{"trigger": "queue_depth", "target_per_worker": 1}]
IDLE = [{"trigger": "idle", "timeout": "10m"}]
LIFE = 6 * 3600.0


def plan(cfg, *machines, pending=0):
    return decide(snap(metrics(pending=pending, in_flight=len(machines)), machines), cfg, NOW)


def lived(lid: str, seconds: float, running: int = 1):
    m = ready(lid, running=running, idle_for=0)
    return replace(m, ready_at=NOW - timedelta(seconds=seconds))


def test_a_machine_that_always_says_busy_is_drained_at_its_max_lifetime():
    cfg = config(BUSY_FOREVER, IDLE, queues={"q": {"max_lifetime": "6h"}})
    got = plan(cfg, lived("old", LIFE), lived("young", LIFE - 1)).for_queue("q").drains
    assert [(d.launch_id, d.trigger, d.when_idle) for d in got] == [("old", "max_lifetime", False)]
    assert "max_lifetime 21600s" in got[0].reason and "busy with 1 task" in got[0].reason


def test_the_lifetime_drains_even_while_the_queue_scales_up_and_below_the_floor():
    cfg = config(BUSY_FOREVER, IDLE, min_workers=2, queues={"q": {"max_lifetime": "6h"}})
    p = plan(cfg, lived("a", LIFE + 10), lived("b", LIFE + 20), pending=5).for_queue("q")
    assert sorted(d.launch_id for d in p.drains) == ["a", "b"]
    assert p.launches  # the queue still wants machines: it rents


def test_without_max_lifetime_a_busy_machine_is_never_drained():
    cfg = config(BUSY_FOREVER, IDLE)
    assert plan(cfg, lived("old", 365 * 86400.0)).for_queue("q").drains == ()


def row(lived_s: float, draining_s: float, running: int = 1) -> Row:
    return Row(
        launch_id="L1",
        queue="q",
        provider="gpu",
        state=S.DRAINING,
        since=NOW - timedelta(seconds=draining_s),
        provider_instance_id="p1",
        last_seen_at=NOW,
        running_tasks=running,
        ready_at=NOW - timedelta(seconds=lived_s),
    )


def life_config(max_lifetime: str | None):
    auto = {
        "provider": "gpu",
        "max_workers": 4,
        "instance": {"gpu": "RTX 4090", "max_price_per_hour": 0.6},
    }
    if max_lifetime is not None:
        auto["max_lifetime"] = max_lifetime
    doc = {"drain_timeout": 3600, "queues": {"q": {"autoscale": auto}}}
    return load_config_text(yaml.safe_dump(doc), registered_providers=PROVIDERS)


def test_a_machine_still_busy_a_drain_timeout_past_its_lifetime_is_destroyed():
    cfg = life_config("6h")
    waits = reconcile((row(LIFE + 3599, 3599),), {}, {}, cfg, NOW)
    assert not waits.transitions  # inside the drain timeout: the drain is retried, busy waits
    done = reconcile((row(LIFE + 3600, 3600),), {}, {}, cfg, NOW)
    (t,) = done.transitions
    assert t.dst == S.TERMINATING and "max_lifetime (21600s)" in t.reason


def test_without_max_lifetime_a_busy_drain_waits_for_ever():
    plan_ = reconcile((row(365 * 86400.0, 30 * 86400.0),), {}, {}, life_config(None), NOW)
    assert not plan_.transitions
    assert [r.step for r in plan_.retries] == ["drain"]


@pytest.mark.parametrize("bad", ["5m", "0s", "-1h"])
def test_a_max_lifetime_under_ten_minutes_is_refused(bad):
    with pytest.raises(ConfigError) as e:
        life_config(bad)
    assert "max_lifetime" in str(e.value)
