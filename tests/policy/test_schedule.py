"""Schedule windows: boundaries, DST in the schedule's zone, scale-down at the cron."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from autoscaler.policy import decide
from autoscaler.policy.schedule import firing_due, latest_firing, window_active

from .helpers import booting, config, metrics, ready, snap


def utc(*a):
    return datetime(*a, tzinfo=UTC)


# ------------------------------------------------------------------ maths


def test_latest_firing_includes_the_exact_firing_minute():
    assert latest_firing("0 9 * * *", "UTC", utc(2025, 6, 2, 9, 0)) == utc(2025, 6, 2, 9, 0)
    assert latest_firing("0 9 * * *", "UTC", utc(2025, 6, 2, 8, 59, 59)) == utc(2025, 6, 1, 9)


def test_window_boundaries_start_inclusive_end_exclusive():
    cron, dur = "0 9 * * *", 3600.0
    assert window_active(cron, "UTC", dur, utc(2025, 6, 2, 8, 59, 59)) is None
    assert window_active(cron, "UTC", dur, utc(2025, 6, 2, 9, 0)) == utc(2025, 6, 2, 9)
    assert window_active(cron, "UTC", dur, utc(2025, 6, 2, 9, 59, 59)) is not None
    assert window_active(cron, "UTC", dur, utc(2025, 6, 2, 10, 0)) is None


def test_timezone_is_applied():
    # 09:00 in Paris in June is 07:00 UTC
    assert latest_firing("0 9 * * *", "Europe/Paris", utc(2025, 6, 2, 7, 30)) == utc(2025, 6, 2, 7)


def test_dst_spring_forward_keeps_wall_clock_time():
    # New York: 2025-03-09 clocks go 02:00 → 03:00. 08:00 local is 13:00 UTC the day before
    # and 12:00 UTC on the day.
    ny = "America/New_York"
    assert latest_firing("0 8 * * *", ny, utc(2025, 3, 8, 23)) == utc(2025, 3, 8, 13)
    assert latest_firing("0 8 * * *", "America/New_York", utc(2025, 3, 9, 12, 30)) == utc(
        2025, 3, 9, 12
    )


def test_dst_skipped_wall_time_fires_right_after_the_gap():
    # Paris 2025-03-30: 02:30 does not exist; fires at 03:00 CEST = 01:00 UTC, once.
    fired = latest_firing("30 2 * * *", "Europe/Paris", utc(2025, 3, 30, 1, 30))
    assert fired == utc(2025, 3, 30, 1, 0)


def test_dst_repeated_wall_time_fires_once():
    # Paris 2025-10-26: 02:30 happens at 00:30 UTC (CEST) and again at 01:30 UTC (CET).
    assert latest_firing("30 2 * * *", "Europe/Paris", utc(2025, 10, 26, 1, 45)) == utc(
        2025, 10, 26, 0, 30
    )
    # so a one-hour window opened at the first 02:30 is closed at the second one
    assert window_active("30 2 * * *", "Europe/Paris", 3600, utc(2025, 10, 26, 1, 45)) is None


def test_window_over_a_dst_change_lasts_real_seconds():
    # 01:00 Paris on 2025-03-30 is 00:00 UTC; a 3 h window ends at 03:00 UTC (05:00 CEST).
    cron = "0 1 * * *"
    assert window_active(cron, "Europe/Paris", 3 * 3600, utc(2025, 3, 30, 2, 59)) is not None
    assert window_active(cron, "Europe/Paris", 3 * 3600, utc(2025, 3, 30, 3, 0)) is None


def test_firing_due_grace():
    assert firing_due("0 22 * * *", "UTC", 60, utc(2025, 6, 2, 22, 0, 59)) == utc(2025, 6, 2, 22)
    assert firing_due("0 22 * * *", "UTC", 60, utc(2025, 6, 2, 22, 1)) is None


# ------------------------------------------------------------------ schedule up through decide


def prewarm(**kw):
    return config(
        [
            {
                "trigger": "schedule",
                "cron": "0 9 * * 1-5",
                "timezone": "Europe/Paris",
                "workers": 3,
                "duration": "2h",
            }
        ],
        max_workers=5,
        **kw,
    )


def test_schedule_up_launches_to_its_floor_inside_the_window():
    now = utc(2025, 6, 2, 7, 0)  # Monday 09:00 Paris
    p = decide(snap(metrics()), prewarm(), now).for_queue("q")
    assert p.floor == 3 and len(p.launches) == 3
    assert all(a.trigger == "schedule" for a in p.launches)
    assert "floor of 3" in p.launches[0].reason


def test_schedule_up_counts_booting_towards_its_floor():
    now = utc(2025, 6, 2, 7, 1)
    machines = (booting("a", now=now), booting("b", now=now))
    p = decide(snap(metrics(), machines), prewarm(), now).for_queue("q")
    assert len(p.launches) == 1


def test_schedule_up_outside_window_and_weekend():
    assert decide(snap(metrics()), prewarm(), utc(2025, 6, 2, 9, 0)).for_queue("q").floor == 0
    assert decide(snap(metrics()), prewarm(), utc(2025, 6, 1, 7, 30)).for_queue("q").floor == 0


def test_floor_is_max_of_min_workers_and_windows():
    p = decide(snap(metrics()), prewarm(min_workers=4), utc(2025, 6, 2, 7, 0)).for_queue("q")
    assert p.floor == 4 and p.launches[0].trigger == "min_workers"


def test_idle_never_drains_below_schedule_floor():
    cfg = config(
        [{"trigger": "schedule", "cron": "0 9 * * *", "workers": 2, "duration": "1h"}],
        [{"trigger": "idle", "timeout": "1m"}],
    )
    now = utc(2025, 6, 2, 9, 30)
    machines = tuple(ready(f"m{i}", idle_for=900 + i, now=now) for i in range(3))
    p = decide(snap(metrics(), machines), cfg, now).for_queue("q")
    assert [d.launch_id for d in p.drains] == ["m2"]  # the most idle, and only one


# ------------------------------------------------------------------ schedule down


def nightly(**kw):
    return config(
        [], [{"trigger": "schedule", "cron": "0 22 * * *", "timezone": "UTC"}], max_workers=6, **kw
    )


def test_schedule_down_drains_idle_now_and_busy_when_idle():
    now = utc(2025, 6, 2, 22, 0, 10)
    machines = (ready("busy", running=1, now=now), ready("idle", idle_for=5, now=now))
    p = decide(snap(metrics(in_flight=1), machines), nightly(), now).for_queue("q")
    by_id = {d.launch_id: d for d in p.drains}
    assert by_id["idle"].when_idle is False
    assert by_id["busy"].when_idle is True
    assert all(d.trigger == "schedule" for d in p.drains)


def test_schedule_down_keeps_min_workers_preferring_to_keep_busy():
    now = utc(2025, 6, 2, 22, 0, 10)
    machines = (ready("busy", running=1, now=now), ready("idle", idle_for=5, now=now))
    p = decide(snap(metrics(in_flight=1), machines), nightly(min_workers=1), now).for_queue("q")
    assert [d.launch_id for d in p.drains] == ["idle"]


def test_schedule_down_spares_machines_launched_after_it_fired():
    now = utc(2025, 6, 2, 22, 0, 50)
    fresh = ready("fresh", created_ago=20, now=now)
    p = decide(snap(metrics(), (fresh,)), nightly(), now).for_queue("q")
    assert p.drains == ()


def test_schedule_down_only_within_grace_of_the_firing():
    late = utc(2025, 6, 2, 22, 1, 0)  # 2 polls of 30 s after 22:00
    p = decide(snap(metrics(), (ready("a", idle_for=5, now=late),)), nightly(), late)
    assert p.for_queue("q").drains == ()


def test_schedule_down_waits_while_scaling_up():
    cfg = config(
        [{"trigger": "queue_depth", "threshold": 0}],
        [{"trigger": "schedule", "cron": "0 22 * * *"}],
    )
    now = utc(2025, 6, 2, 22, 0, 5)
    p = decide(snap(metrics(pending=4), (ready("a", idle_for=5, now=now),)), cfg, now)
    q = p.for_queue("q")
    assert len(q.launches) == 1 and q.drains == ()


def test_drain_requested_worker_is_drained_once_idle():
    now = utc(2025, 6, 2, 23)
    p = decide(snap(metrics(), (ready("a", drain_requested=True, now=now),)), nightly(), now)
    (d,) = p.for_queue("q").drains
    assert d.trigger == "drain_requested" and not d.when_idle


def test_dst_schedule_down_in_zone():
    cfg = config(
        [], [{"trigger": "schedule", "cron": "0 22 * * *", "timezone": "America/New_York"}]
    )
    # 22:00 EST on 2025-11-03 is 03:00 UTC on 2025-11-04 (after the fall-back on Nov 2)
    now = utc(2025, 11, 4, 3, 0, 10)
    p = decide(snap(metrics(), (ready("a", idle_for=5, now=now),)), cfg, now)
    assert [d.launch_id for d in p.for_queue("q").drains] == ["a"]
    an_hour_early = now - timedelta(hours=1)
    p = decide(snap(metrics(), (ready("a", idle_for=5, now=an_hour_early),)), cfg, an_hour_early)
    assert p.for_queue("q").drains == ()
