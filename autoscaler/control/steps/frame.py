"""The frame every lifecycle step runs in, written once:

    read the machine's row -> check it is where the step starts -> load the config it was
    rented under -> the step's own reads, in that transaction -> the step's work: its provider
    calls gated on the provider's hold and inside one error ladder (`Machine.call`), its
    conditional move with its event (`Machine.move`) -> what the outcome asks sent, once
    everything is committed.

A step is a short declaration (`Step`): its name, the states it starts from, and two hooks,
`read` (in the read transaction) and `act` (after it). It returns a typed `Outcome`: callers
branch on `outcome.kind`; `str(outcome)` is the text the Celery task returns (what Flower shows
and the CLI and API print).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from autoscaler.access.credentials import CredentialError
from autoscaler.control import rate_limits
from autoscaler.control.outbox import Outbox, StepName
from autoscaler.control.runtime import Loaded, Runtime, log, utc_now
from autoscaler.lifecycle import InstanceState
from autoscaler.providers.base import Provider, ProviderError
from autoscaler.store import events, instances, moves
from autoscaler.store.db import Session
from autoscaler.store.instances import InstanceDetails

T = TypeVar("T")
R = TypeVar("R")


class Kind(enum.Enum):
    """What became of one run of a step."""

    DONE = "done"
    """It did what it is for: rented (booting), drained, stopped, started, destroyed, handed
    back."""
    WAITING = "waiting"
    """Not now: a provider held or failing, a worker still busy, a broker not reached, not due
    yet. Nothing is lost: the step is sent again (by reconcile, or after `again_in`)."""
    LEFT = "left"
    """Left to reconcile: the provider's answer is not final (an ambiguous create, a stop it
    has not confirmed yet); reconcile looks the machine up and finishes."""
    SKIPPED = "skipped"
    """Nothing for this step to do: no such machine, or not where the step starts (another
    run did it, or it moved on)."""
    CANCELLED = "cancelled"
    """An operator's drain cancelled a machine not ready yet (never rented, destroyed once its
    create returns, or destroyed now)."""
    FAILED = "failed"
    """The launch failed: nothing was rented, the row is closed as failed."""
    ABANDONED = "abandoned"
    """The step gave its machine up, which is destroyed instead: a warm miss, a machine its
    provider cannot stop."""
    AGAIN = "again"
    """Read the row again: it moved under the step (within one run only; the frame turns the
    last one into WAITING)."""


@dataclass(frozen=True)
class Outcome:
    """A step's typed result. `then` (steps of the same machine), `evaluate` (a queue) and
    `again_in` (this step again, in seconds) are sent by the frame once the step's writes have
    committed, to the outbox it was given."""

    kind: Kind
    text: str
    then: tuple[StepName, ...] = ()
    evaluate: str | None = None
    again_in: float | None = None

    def __str__(self) -> str:
        return self.text


def done(text: str, *then: StepName) -> Outcome:
    return Outcome(Kind.DONE, text, then)


def waiting(why: str) -> Outcome:
    """`waiting: <why>`."""
    return Outcome(Kind.WAITING, f"waiting: {why}")


def skipped(text: str) -> Outcome:
    return Outcome(Kind.SKIPPED, text)


AGAIN = Outcome(Kind.AGAIN, "the machine moved under the step: read it again")


@dataclass(frozen=True)
class StepRead:
    """What the frame read for one run of a step: the row, the config it was rented under
    (None when no config can be loaded), and what earlier reads of this run said (each
    AGAIN)."""

    rt: Runtime
    step: StepName
    row: InstanceDetails
    loaded: Loaded | None
    before: tuple[Outcome, ...] = ()

    @property
    def launch_id(self) -> str:
        return self.row.launch_id

    @property
    def queue(self) -> str:
        return self.row.queue

    @property
    def queue_cfg(self) -> Any:
        """The machine's queue in its config, or None."""
        return self.loaded.config.queues.get(self.queue) if self.loaded else None

    def call(
        self,
        work: Callable[[Provider], R],
        *,
        passes: tuple[type[Exception], ...] = (),
    ) -> R | Outcome:
        """`work` on the machine's provider, as the config it was rented under builds it: at
        once WAITING while the provider is held (a rate limit, no answer); each call bounded
        by the step deadline; a 429 or a missed deadline held for every process; a provider
        error, a missing key or provider: WAITING with its text (logged). `passes` lets the
        step's own refusals through."""
        name = self.row.provider
        try:
            with rate_limits.answering(self.rt, name, self.loaded, self.queue):
                return work(self.rt.provider(name, self.loaded))
        except passes:
            raise
        except rate_limits.Held as held:
            return Outcome(Kind.WAITING, held.waiting)
        except (ProviderError, CredentialError, KeyError) as exc:
            log.warning("%s %s: %s", self.step, self.launch_id, exc)
            return waiting(str(exc)[:300])

    def move(
        self,
        src: InstanceState,
        dst: InstanceState,
        reason: str,
        said: Iterable[Mapping[str, Any]] = (),
        **fields: Any,
    ) -> bool:
        """The conditional move src -> dst with its events, in one transaction; True if this
        call moved the row (the events are written only then)."""
        now = utc_now()
        with self.rt.transaction() as session:
            moved = moves.move(session, self.launch_id, src, dst, now, reason, **fields)
            if moved:
                events.record(session, list(said), now)
        return moved


class Step(Generic[T]):
    """A lifecycle step's declaration. The frame reads the row (`check`: its state in `starts`,
    else `not_here`: SKIPPED "not <doing> (<state>)"), loads its config (the exact version it
    was decided under with `exact_version`, else that version or the newest), calls `read` in
    the same transaction, then `act` with what `read` kept; up to `tries` runs while a hook
    says AGAIN."""

    name: ClassVar[StepName]
    starts: ClassVar[frozenset[InstanceState] | None] = None
    """The states the step starts from (None: any, the step sorts them out in `read`)."""
    doing: ClassVar[str] = ""
    exact_version: ClassVar[bool] = False
    tries: ClassVar[int] = 1

    def check(self, session: Session, row: InstanceDetails | None) -> Outcome | None:
        """Before the config is loaded: an outcome ends the run here."""
        if row is None or (self.starts is not None and row.state not in self.starts):
            return self.not_here(row)
        return None

    def not_here(self, row: InstanceDetails | None) -> Outcome:
        """No such machine, or not in a state the step starts from."""
        return skipped(f"not {self.doing} ({row.state.value if row else 'no such machine'})")

    def read(self, session: Session, m: StepRead) -> T | Outcome:
        """In the read transaction: what `act` needs, or an outcome."""
        raise NotImplementedError

    def act(self, m: StepRead, kept: T) -> Outcome:
        """After the read transaction: provider calls (`m.call`), moves (`m.move`)."""
        raise NotImplementedError


def run_step(step: Step[Any], rt: Runtime, launch_id: str, outbox: Outbox | None = None) -> Outcome:
    """Run `step` for one machine, once (idempotent: every move is conditional); what the
    outcome asks is sent to `outbox` (None: nothing is sent; reconcile sends what is lost)."""
    before: list[Outcome] = []
    for _ in range(step.tries):
        outcome = _once(step, rt, launch_id, tuple(before))
        if outcome.kind is not Kind.AGAIN:
            break
        before.append(outcome)
    else:
        outcome = waiting(f"the machine changed state while asked to {step.name}; ask again")
    if outbox is not None:
        _send(outbox, step.name, launch_id, outcome)
    return outcome


def _once(step: Step[Any], rt: Runtime, launch_id: str, before: tuple[Outcome, ...]) -> Outcome:
    with rt.transaction() as session:
        row = instances.get(session, launch_id)
        refused = step.check(session, row)
        if refused is not None:
            return refused
        assert row is not None  # `check` refuses a missing row
        version = row.config_version
        loaded = (
            rt.load_version(session, version)
            if step.exact_version
            else rt.load_for(session, version)
        )
        m = StepRead(rt, step.name, row, loaded, before)
        kept = step.read(session, m)
    if isinstance(kept, Outcome):
        return kept
    return step.act(m, kept)


def _send(outbox: Outbox, name: StepName, launch_id: str, outcome: Outcome) -> None:
    """What `outcome` asks for, in order: the machine's next steps, its queue evaluated now,
    this step again later."""
    for then in outcome.then:
        outbox.step(then, launch_id)
    if outcome.evaluate is not None:
        outbox.evaluate(outcome.evaluate)
    if outcome.again_in is not None:
        outbox.step(name, launch_id, after=outcome.again_in)
