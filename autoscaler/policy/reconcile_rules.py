"""The rules of `policy.reconcile`, one per lifecycle stage: what one row calls for.

Each returns the row's one `Transition`, `Retry` or `NoteSilence` (or nothing), from the
provider's list and the worker's last signs of life (`_Facts`); `policy.reconcile_plan.typed`
turns them into the plan's actions. The module docstring of `policy.reconcile` says the rules
in prose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from autoscaler.config.models import Config
from autoscaler.lifecycle import InstanceState, MachineStatus
from autoscaler.policy.reconcile_plan import NoteSilence, Retry, Transition

S = InstanceState

CREATE_GRACE = 120.0
"""Seconds a create of unknown outcome is looked for by label before the launch is failed."""

ORPHAN_GRACE = 300.0
"""Seconds a machine with our label and no live row is left alone before it is destroyed (a
launch that is writing its row right now must not lose its machine)."""

INTENT_STALE = 30.0
"""Seconds after which a launch intent nobody claimed (its task lost) is enqueued again (or
three poll intervals, if shorter: a second launch task for one intent is harmless, its claim
fails)."""

STEP_RETRY = 30.0
"""Seconds after which an unfinished drain or destroy is enqueued again (or one poll interval,
if shorter)."""

STOP_TIMEOUT = 600.0
"""Seconds a stop may take to show at the provider; a machine not stopped by then is destroyed
(a pool's place is not worth a machine billing at full price unseen)."""

DEAD_STOP_GRACE = 60.0
"""Seconds a machine being stopped may be listed dead (its agent exited once drained) before
it is destroyed rather than stopped: the stop step runs again meanwhile."""

SILENCE_CONFIRM = 0.5
"""Silence destroys a machine only when two reconcile rounds find it, the second at least this
share of a poll interval after the first (two reconcilers racing are one round): one reading
of one clock never decides a destroy."""


@dataclass(frozen=True)
class Row:
    """One instance row as the reconciler sees it. `since` is when it entered its state;
    `last_seen_at` is the last sign of life of its worker (agent heartbeat or broker)."""

    launch_id: str
    queue: str
    provider: str
    state: InstanceState
    since: datetime
    provider_instance_id: str | None = None
    host_id: str | None = None
    last_seen_at: datetime | None = None
    running_tasks: int = 0
    remote_control: bool = False
    """Its worker is seen only through Celery remote control (no agent heartbeats it): silence
    then cannot tell a busy `--pool solo` worker from a dead one."""
    silence_noted_at: datetime | None = None
    """When a reconcile round last found it silent past its limit (the first of two rounds)."""
    keep_warm: bool = False
    """Drained, it goes to its queue's warm pool (stopped), not destroyed."""
    spec_key: str | None = None
    """What it was rented as (`policy.warm.spec_key`)."""
    ready_at: datetime | None = None
    """When its worker last came up (its boot or its latest resume): its lifetime's start."""


@dataclass(frozen=True)
class Listed:
    """One machine a provider lists under our label."""

    provider_instance_id: str
    launch_id: str
    label: str
    status: MachineStatus
    host_id: str | None = None
    raw_status: str | None = None
    """The provider's own word for its state (for the events: "outbid", "exited")."""


@dataclass(frozen=True)
class ProviderView:
    """What one provider says. `listed=False`: its list failed, so nothing is known.
    `ready_when_running`: its machines have no worker to report (mock): running means ready."""

    provider: str
    listed: bool
    machines: tuple[Listed, ...] = ()
    ready_when_running: bool = False


def own_machine(row: Row, candidates: list[Listed]) -> Listed | None:
    """The row's own machine among those listed under its label: the one with its provider id
    once it has one (a second machine under the same label is an orphan and decides nothing
    about the row), else the first (a create of unknown outcome being adopted)."""
    if row.provider_instance_id is not None:
        return next(
            (m for m in candidates if m.provider_instance_id == row.provider_instance_id), None
        )
    return candidates[0] if candidates else None


def age(since: datetime | None, now: datetime) -> float:
    return (now - since).total_seconds() if since is not None else float("inf")


@dataclass(frozen=True)
class _Facts:
    """What the provider's list and the worker's last signs of life say about one row."""

    age: float
    """Seconds in its state."""
    known: bool
    """The provider's list was read."""
    machine: Listed | None
    dead: bool
    running: bool
    seen: datetime | None
    """The worker's last sign of life (now, for a running machine that has no worker)."""
    silent_for: float
    host: str | None
    blind: bool
    """Its only sign of life is the provider's list (mock), and the list could not be read."""


def judge_row(
    row: Row,
    view: ProviderView | None,
    known: bool,
    machine: Listed | None,
    config: Config,
    now: datetime,
    retire: Mapping[str, str],
) -> Transition | Retry | NoteSilence | None:
    """The one move, retry or silence note the row calls for, along its lifecycle stage."""
    facts = _facts(row, view, known, machine, now)
    state = row.state
    if state == S.PENDING:
        return _pending(row, facts, config)
    if state == S.CREATING:
        return _creating(row, facts)
    lost = _gone_or_dead(row, facts)
    if lost is not None:
        return lost
    if state == S.BOOTING:
        return _booting(row, facts, config)
    if state in (S.READY, S.DRAINING):
        why = _silence(row, facts, config)
        if why is not None:
            return _confirm_silence(row, why, facts, config, now)
    if state == S.DRAINING:
        return _outlived(row, config, now) or _draining(row, facts, config)
    if state == S.DRAINED:
        if row.keep_warm:
            return _move(row, S.STOPPING, "drained: stop it for the warm pool")
        return _move(row, S.TERMINATING, "drained: destroy the machine")
    if state == S.STOPPING:
        return _stopping(row, facts, config)
    if state == S.STOPPED:
        return _stopped(row, facts, retire.get(row.launch_id))
    if state == S.RESUMING:
        return _resuming(row, facts, config)
    if state == S.TERMINATING:
        return _terminating(row, facts, config)
    return None


def _move(
    row: Row,
    dst: InstanceState,
    reason: str,
    *,
    provider_instance_id: str | None = None,
    host_id: str | None = None,
    rental: Literal["failed", "ok"] | None = None,
    avoid_host: bool = False,
    warm: Literal["hit", "miss"] | None = None,
) -> Transition:
    """The row from its state to `dst`, with the reason."""
    return Transition(
        row.launch_id,
        row.queue,
        row.provider,
        row.state,
        dst,
        reason,
        provider_instance_id=provider_instance_id,
        host_id=host_id,
        rental=rental,
        avoid_host=avoid_host,
        warm=warm,
    )


def _facts(
    row: Row, view: ProviderView | None, known: bool, machine: Listed | None, now: datetime
) -> _Facts:
    dead = machine is not None and machine.status in (MachineStatus.DEAD, MachineStatus.STOPPED)
    running = machine is not None and machine.status == MachineStatus.RUNNING
    mock = view is not None and view.ready_when_running
    seen = now if mock and running else row.last_seen_at  # running is a mock's sign of life
    return _Facts(
        age=age(row.since, now),
        known=known,
        machine=machine,
        dead=dead,
        running=running,
        seen=seen,
        silent_for=age(seen if seen is not None else row.since, now),
        host=machine.host_id if machine is not None else row.host_id,
        # missing data never destroys anything
        blind=mock and not known,
    )


def _step_retry(config: Config) -> float:
    return min(STEP_RETRY, config.poll_interval)


def _boot_timeout(row: Row, config: Config) -> float:
    return config.queue_settings(row.queue).boot_timeout


def _pending(row: Row, f: _Facts, config: Config) -> Retry | None:
    """An intent no launch task claimed is enqueued again."""
    if f.age >= min(INTENT_STALE, 3 * config.poll_interval):
        return Retry(row.launch_id, row.queue, "launch", f"intent unclaimed for {f.age:.0f}s")
    return None


def _creating(row: Row, f: _Facts) -> Transition | None:
    """A create of unknown outcome: adopted when its label shows up, failed after the grace."""
    if f.machine is not None:
        return _move(
            row,
            S.BOOTING,
            f"create confirmed: {f.machine.provider_instance_id} carries its label",
            provider_instance_id=f.machine.provider_instance_id,
            host_id=f.machine.host_id,
        )
    if f.known and f.age >= CREATE_GRACE:
        return _move(
            row,
            S.FAILED,
            f"create outcome unknown and no machine with its label after {f.age:.0f}s",
            rental="failed",
        )
    return None


HELD_JOBS = frozenset({S.READY, S.DRAINING})
"""States in which a machine's worker may hold jobs (a drained one has finished them)."""


def _gone_or_dead(row: Row, f: _Facts) -> Transition | None:
    """A machine its provider no longer lists is lost; one it lists as dead (or stopped by the
    provider) is destroyed. Either way the provider says it no longer runs: the jobs its worker
    held are handed back (never for a machine merely silent while its provider runs it)."""
    state = row.state
    handback = state in HELD_JOBS
    if state in (S.BOOTING, S.READY, S.DRAINING, S.DRAINED) and f.known and f.machine is None:
        return replace(
            _move(row, S.LOST, f"gone at the provider while {state.value}", rental=_failed(state)),
            handback=handback,
        )
    if state in (S.BOOTING, S.READY, S.DRAINING) and f.dead:
        status = (f.machine.raw_status or f.machine.status.value) if f.machine else "?"
        if f.machine is not None and f.machine.raw_status == OUTBID:
            return replace(
                _move(
                    row,
                    S.TERMINATING,
                    f"preempted while {state.value}: outbid, stopped by the provider",
                    host_id=f.host,
                ),
                handback=handback,
                preempted=True,
            )
        return replace(
            _move(
                row,
                S.TERMINATING,
                f"dead at the provider while {state.value} ({status})",
                rental=_failed(state),
                avoid_host=state == S.BOOTING and f.host is not None,
                host_id=f.host,
            ),
            handback=handback,
        )
    return None


OUTBID = "outbid"
"""A provider's raw status for an interruptible machine it stopped because a higher bid won
(`providers.vast.OUTBID`)."""


def _booting(row: Row, f: _Facts, config: Config) -> Transition | None:
    """Ready at its worker's first sign of life; a failed rental after the boot timeout."""
    if f.seen is not None and f.seen >= row.since:
        return _move(row, S.READY, "its worker is up", rental="ok")
    boot_timeout = _boot_timeout(row, config)
    if f.age >= boot_timeout:
        return _move(
            row,
            S.TERMINATING,
            f"no ready worker after the boot timeout ({boot_timeout:.0f}s)",
            rental="failed",
            avoid_host=f.host is not None,
            host_id=f.host,
        )
    return None


def _silence_limit(row: Row, f: _Facts, config: Config) -> float:
    """How long the worker may be silent. A worker busy with a task may not answer (a `--pool
    solo` Celery worker cannot while it runs one): while its machine still runs (or the list is
    unknown), its last word "busy" holds for drain_timeout. A worker seen only through remote
    control may have taken a job right after a sighting that found it idle (a solo worker is
    then silent for the whole job): on a machine its provider lists as running, its silence
    gets drain_timeout too. An agent heartbeats from its own process, busy or not: its silence
    is the agent's."""
    busy_and_running = (row.running_tasks > 0 and (f.running or not f.known)) or (
        row.remote_control and f.running
    )
    if busy_and_running:
        return max(config.heartbeat_timeout, config.drain_timeout)
    return config.heartbeat_timeout


def _silence(row: Row, f: _Facts, config: Config) -> str | None:
    """Why the worker counts as silent past its limit, or None while it is not (or blind)."""
    limit = _silence_limit(row, f, config)
    if f.blind or f.silent_for < limit:
        return None
    return f"silent for {f.silent_for:.0f}s (timeout {limit:.0f}s)" + (
        f"; it reported {row.running_tasks} running task(s)" if row.running_tasks else ""
    )


def _confirm_silence(
    row: Row, why: str, f: _Facts, config: Config, now: datetime
) -> Transition | NoteSilence | None:
    """Silence destroys only when a second round, SILENCE_CONFIRM later, still finds it."""
    noted = row.silence_noted_at
    spoke_since = noted is not None and f.seen is not None and f.seen > noted
    if noted is None or spoke_since or noted > now:
        return NoteSilence(row.launch_id, row.queue, why)
    if age(noted, now) < SILENCE_CONFIRM * config.poll_interval:
        return None  # the same round, or one racing it: wait for the next
    return replace(
        _move(row, S.TERMINATING, f"{why}, in two reconcile rounds"),
        silenced=True,
        heard_at=row.last_seen_at,
    )


def _outlived(row: Row, config: Config, now: datetime) -> Transition | None:
    """A machine drained for its queue's `max_lifetime` and still not done `drain_timeout`
    later is destroyed, busy or not: the bound its own word cannot hold off."""
    queue = config.queues.get(row.queue)
    auto = queue.autoscale if queue is not None else None
    limit = auto.max_lifetime if auto is not None else None
    if limit is None or row.ready_at is None:
        return None
    lived = age(row.ready_at, now)
    if lived < limit + config.drain_timeout:
        return None
    return _move(
        row,
        S.TERMINATING,
        f"served {lived:.0f}s, past its queue's max_lifetime ({limit:.0f}s) and the drain "
        f"timeout ({config.drain_timeout:.0f}s) after it, still not drained: destroyed",
    )


def _draining(row: Row, f: _Facts, config: Config) -> Retry | None:
    """A drain not finished is enqueued again (a busy one past the drain timeout waits)."""
    if f.age < _step_retry(config):
        return None
    overdue = f.age >= config.drain_timeout
    return Retry(
        row.launch_id,
        row.queue,
        "drain",
        f"draining for {f.age:.0f}s"
        + (
            f", past the drain timeout ({config.drain_timeout:.0f}s) but still busy: waiting"
            if overdue and row.running_tasks
            else ""
        ),
    )


def _stopping(row: Row, f: _Facts, config: Config) -> Transition | Retry | None:
    """Stopped once the provider lists it so; the stop retried, and the machine destroyed if
    the stop never takes."""
    status = f.machine.status if f.machine is not None else None
    if f.known and f.machine is None:
        return _move(row, S.LOST, "gone at the provider while stopping")
    if status == MachineStatus.STOPPED:
        return _move(row, S.STOPPED, "stopped at the provider, its disk kept for the warm pool")
    if status == MachineStatus.DEAD and f.age >= max(2 * _step_retry(config), DEAD_STOP_GRACE):
        return _move(row, S.TERMINATING, "dead at the provider and not stopped by a stop")
    if status == MachineStatus.DEAD:
        # its worker drained and its agent exited, so the machine's processes ended by
        # themselves: the stop step still stops it at the provider (and keeps its disk)
        return Retry(row.launch_id, row.queue, "stop", "its processes ended: stop it")
    if f.age >= STOP_TIMEOUT:
        return _move(
            row, S.TERMINATING, f"not stopped at the provider after {f.age:.0f}s: destroyed instead"
        )
    if f.age >= _step_retry(config):
        return Retry(row.launch_id, row.queue, "stop", f"stopping for {f.age:.0f}s")
    return None


def _stopped(row: Row, f: _Facts, retire: str | None) -> Transition | None:
    """A pool's machine stays while the provider keeps it stopped and the pool wants it."""
    status = f.machine.status if f.machine is not None else None
    if f.known and f.machine is None:
        return _move(row, S.LOST, "gone at the provider while stopped")
    if retire is not None:
        return _move(row, S.TERMINATING, retire)
    if status == MachineStatus.DEAD:
        return _move(row, S.TERMINATING, "dead at the provider while stopped")
    if status in (MachineStatus.RUNNING, MachineStatus.STARTING):
        return _move(
            row,
            S.TERMINATING,
            f"{status.value} at the provider though we stopped it and did not resume it: "
            "billing unseen, destroyed",
        )
    return None


def _resume_timeout(row: Row, config: Config) -> float:
    queue_cfg = config.queues.get(row.queue)
    auto = queue_cfg.autoscale if queue_cfg is not None else None
    return auto.warm_pool.resume_timeout if auto is not None else _boot_timeout(row, config)


def _resuming(row: Row, f: _Facts, config: Config) -> Transition | Retry | None:
    """A warm hit at its worker's first sign of life since the resume; a warm miss when it dies,
    vanishes or has no ready worker by `resume_timeout` (its host avoided, no backoff)."""
    if f.known and f.machine is None:
        return _move(row, S.LOST, "gone at the provider while resuming", warm="miss")
    if f.seen is not None and f.seen >= row.since:
        return _move(row, S.READY, "its worker is up again: resumed from the warm pool", warm="hit")
    timeout = _resume_timeout(row, config)
    why = None
    if f.dead and f.machine is not None and f.machine.status == MachineStatus.DEAD:
        why = "dead at the provider while resuming"
    elif f.age >= timeout:
        why = f"no ready worker {f.age:.0f}s after the resume (resume_timeout {timeout:.0f}s)"
    if why is not None:
        return _move(
            row,
            S.TERMINATING,
            f"warm miss: {why}",
            avoid_host=f.host is not None,
            host_id=f.host,
            warm="miss",
        )
    stopped = f.machine is not None and f.machine.status == MachineStatus.STOPPED
    if stopped and f.age >= _step_retry(config):
        return Retry(row.launch_id, row.queue, "resume", f"still stopped {f.age:.0f}s on")
    return None


def _terminating(row: Row, f: _Facts, config: Config) -> Transition | Retry | None:
    """Terminated once the provider no longer lists it; the destroy retried otherwise."""
    if f.known and f.machine is None:
        return _move(row, S.TERMINATED, "the provider no longer lists it")
    if f.age >= _step_retry(config):
        return Retry(row.launch_id, row.queue, "terminate", f"terminating for {f.age:.0f}s")
    return None


def _failed(state: InstanceState) -> Literal["failed"] | None:
    """A machine lost before it ever served is a failed rental (it feeds the backoff)."""
    return "failed" if state == S.BOOTING else None
