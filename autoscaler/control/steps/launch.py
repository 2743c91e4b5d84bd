"""Launch: claim one intent, rent its machine, record what the provider said.

pending -> creating (a conditional write: one claimant) -> booting with the provider's id, real
price and host. What failed decides what comes next:
- capacity, auth, a refused request, a transient error: the launch failed, the (queue,
  provider) backs off (persisted), the row is closed as failed;
- a 429 (nothing was rented): the row is closed as failed and the provider's reset is recorded
  for every process (`control.rate_limits`): no launch for that provider calls it before then,
  and it is no failure of the rental (the backoff does not grow);
- an operator's drain while the create is in flight (`cancel_requested_at`): checked before the
  create (nothing is rented) and in the same transaction as the move to booting (the machine
  goes straight to terminating, and its destroy is sent);
- an ambiguous create (5xx or timeout after the request left) or any unexpected error once the
  provider may have been called: the row stays `creating`; reconcile looks the label up and
  adopts the machine, or fails the launch after a grace time. A create is never tried twice
  for one launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoscaler.access import keys
from autoscaler.access.credentials import CredentialError
from autoscaler.control import machines, placement, rate_limits
from autoscaler.control.runtime import Loaded, Runtime, log, utc_now
from autoscaler.control.steps import drain
from autoscaler.control.steps.credentials import drop_broker_user, machine_env, make_broker_user
from autoscaler.control.steps.frame import Kind, Outcome, Step, StepRead, done, skipped
from autoscaler.lifecycle import InstanceState
from autoscaler.providers.base import (
    AmbiguousCreateError,
    LaunchSpec,
    Provider,
    ProviderError,
)
from autoscaler.providers.labels import ENV_LABEL
from autoscaler.store import boots, events, instances, intents, moves
from autoscaler.store.db import Session
from autoscaler.store.instances import InstanceDetails

S = InstanceState

NOT_PENDING = "not pending (claimed already, or closed)"


@dataclass(frozen=True)
class _Claim:
    """What the claim's transaction read: the machine's worker token (only its hash is stored),
    the installation, the boot times placement weighs."""

    token: str
    install: str
    boot_times: Any
    fallback_boot: Any


class LaunchStep(Step[_Claim]):
    """Carry out one launch intent. A machine cancelled while its create was in flight has its
    destroy sent (reconcile sends it too, later, if it is lost)."""

    name = "launch"
    starts = frozenset({S.PENDING})
    exact_version = True  # exactly what decide() judged: the config version of the decision

    def not_here(self, row: InstanceDetails | None) -> Outcome:
        return skipped(NOT_PENDING)

    def read(self, session: Session, m: StepRead) -> _Claim | Outcome:
        now = utc_now()
        token = keys.new_secret()  # the machine's worker token: only its hash is stored
        if not intents.claim_intent(session, m.launch_id, now, keys.digest(token)):
            return skipped(NOT_PENDING)
        install = m.rt.installation_id(session)
        boot_times, fallback_boot = boots.placement_boot_times(session, m.queue, now)
        return _Claim(token, install, boot_times, fallback_boot)

    def act(self, m: StepRead, claim: _Claim) -> Outcome:
        rt, launch_id, queue, row = m.rt, m.launch_id, m.queue, m.row
        provider_name, version, loaded = row.provider, row.config_version, m.loaded
        names = tuple((row.placement or {}).get("providers") or (provider_name,))
        token = claim.token
        if loaded is None and version is not None:
            why = (
                f"config version {version}, which asked for it, no longer validates; nothing rented"
            )
            return _fail(rt, launch_id, queue, provider_name, why, None)
        queue_cfg = m.queue_cfg
        auto = queue_cfg.autoscale if queue_cfg else None
        if loaded is None or auto is None or not auto.enabled:
            why = "the queue is no longer autoscaled"
            return _fail(rt, launch_id, queue, provider_name, why, None)
        outcome = placement.PlacementOutcome()
        providers = _usable(rt, loaded, names, outcome)
        if not providers:
            return _not_placed(rt, launch_id, queue, provider_name, outcome, loaded.config.backoff)
        if _cancel_requested(rt, launch_id):
            why = f"{drain.CANCELLED}: an operator drained it before its create; nothing was rented"
            return _fail(rt, launch_id, queue, provider_name, why, None, action="cancelled")
        unreachable = make_broker_user(rt, claim.install, launch_id, queue, queue_cfg, token)
        if unreachable is not None:  # never a machine without the credentials it needs
            why = (
                f"{unreachable}; nothing was rented (the machine could never have reached its "
                "queue)"
            )
            return _fail(rt, launch_id, queue, provider_name, why, loaded.config.backoff)
        env = machine_env(queue, queue_cfg, rt.settings.api_url, token)
        launch = LaunchSpec.new(claim.install, launch_id, env)

        def before_create(name: str) -> bool:
            if len(providers) == 1:
                return True  # the row names it already
            with rt.transaction() as session:
                return intents.try_provider(session, launch_id, name)

        try:
            placement.place(
                providers,
                auto,
                launch,
                claim.boot_times,
                claim.fallback_boot,
                before_create,
                outcome,
                interruptible=bool(row.interruptible) and auto.instance.interruptible is not None,
            )
        except AmbiguousCreateError as exc:
            why = f"{_text(exc, token)}; reconcile looks it up by label"
            _note(rt, launch_id, queue, "create_ambiguous", why)
            return Outcome(Kind.LEFT, "ambiguous: left to reconcile")
        except Exception as exc:  # the create may have left: treat as ambiguous, never re-create
            log.exception("launch %s: unexpected error; left to reconcile", launch_id)
            _note(rt, launch_id, queue, "create_ambiguous", f"unexpected {type(exc).__name__}")
            return Outcome(Kind.LEFT, "unexpected error: left to reconcile")
        finally:
            for name, limited in outcome.limited.items():
                rate_limits.note(rt, name, limited, queue)
        if outcome.placed is None:
            return _not_placed(rt, launch_id, queue, provider_name, outcome, loaded.config.backoff)
        return _booting(rt, launch_id, queue, outcome, loaded.config.backoff, launch)


def _usable(
    rt: Runtime, loaded: Loaded, names: tuple[str, ...], outcome: placement.PlacementOutcome
) -> dict[str, Provider]:
    """The launch's providers that may be called now: not held (a rate limit or no answer is no
    failure of the rental) and built with their key (a missing or undecryptable key fails it)."""
    usable: dict[str, Provider] = {}
    for name in names:
        limit = rate_limits.current(rt, name)
        if limit is not None:
            what = "rate limited" if limit.cause == "rate_limit" else "not answering"
            outcome.held[name] = (
                f"{what}: {name} takes no calls before "
                f"{limit.until.isoformat(timespec='seconds')} ({limit.reason})"
            )
            continue
        try:
            usable[name] = rt.provider(name, loaded)
        except (CredentialError, ProviderError, KeyError, ValueError) as exc:
            outcome.fail(name, exc)
    return usable


def _booting(
    rt: Runtime,
    launch_id: str,
    queue: str,
    outcome: placement.PlacementOutcome,
    backoff: Any,
    launch: LaunchSpec,
) -> Outcome:
    """The machine is rented: the row moves to booting with what the provider said, and the
    providers that failed this launch before it back off."""
    assert outcome.placed is not None
    machine, offer = outcome.placed.machine, outcome.placed.offer
    name = offer.provider
    now = utc_now()
    with rt.transaction() as session:
        moves.move(
            session,
            launch_id,
            S.CREATING,
            S.BOOTING,
            now,
            f"rented {machine.provider_instance_id} on {name} ({machine.gpu or offer.gpu}"
            + (f", interruptible at ${offer.price_per_hour:g}/h)" if _bid(offer) else ")"),
            provider=name,
            provider_instance_id=machine.provider_instance_id,
            host_id=machine.host_id,
            gpu=machine.gpu or offer.gpu,
            price_per_hour=machine.price_per_hour
            if machine.price_per_hour is not None
            else offer.price_per_hour,
            offer={"offer_id": offer.offer_id, "price_per_hour": offer.price_per_hour},
            storage_price_per_hour=machine.storage_price_per_hour,
            interruptible=offer.details.get("interruptible") is True,
        )
        _backoffs(session, queue, outcome, now, backoff)
        events.record(
            session,
            [
                events.event(
                    "launch",
                    "created",
                    f"{name} rented {machine.provider_instance_id} ({launch.env.get(ENV_LABEL)})",
                    queue=queue,
                    launch_id=launch_id,
                    details={
                        "provider": name,
                        "price_per_hour": machine.price_per_hour,
                        "host": machine.host_id,
                        **({"passed_over": _causes(outcome)} if outcome.failures else {}),
                    },
                )
            ],
            now,
        )
        cancelled = drain.cancel_if_requested(session, launch_id, now)
    if cancelled:
        text = f"cancelled: {machine.provider_instance_id} is being destroyed"
        return Outcome(Kind.CANCELLED, text, ("terminate",))
    return done(f"booting: {machine.provider_instance_id} on {name}")


def _bid(offer: Any) -> bool:
    return offer.details.get("interruptible") is True


def _causes(outcome: placement.PlacementOutcome) -> dict[str, str]:
    return {name: cause for name, (cause, _) in outcome.failures.items()}


def _backoffs(
    session: Any, queue: str, outcome: placement.PlacementOutcome, now: Any, backoff: Any
) -> None:
    """Each provider that failed this launch backs off on its own (queue, provider)."""
    for name, (cause, text) in outcome.failures.items():
        machines.rental_failed(session, queue, name, now, backoff, text, cause)


def _not_placed(
    rt: Runtime,
    launch_id: str,
    queue: str,
    provider: str,
    outcome: placement.PlacementOutcome,
    backoff: Any,
) -> Outcome:
    """Nothing was rented on any provider: the launch fails; the providers that failed it back
    off, each with its cause; rate-limited ones only wait for their reset."""
    reason = str(placement.placement_error(outcome))
    if not outcome.failures:  # only rate limits: no failure of the rental
        return _fail(rt, launch_id, queue, provider, reason, None, action="rate_limited")
    return _fail(rt, launch_id, queue, provider, reason, backoff, outcome=outcome)


def _cancel_requested(rt: Runtime, launch_id: str) -> bool:
    with rt.transaction() as session:
        row = instances.get(session, launch_id)
        return row is not None and row.cancel_requested_at is not None


def _text(exc: BaseException, *secrets: str) -> str:
    """An error's text for the events, without the launch's secrets (the provider client
    scrubs them already; this is the second fence)."""
    text = str(exc)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text[:500] or type(exc).__name__


def _fail(
    rt: Runtime,
    launch_id: str,
    queue: str,
    provider: str,
    reason: str,
    backoff: Any,
    *,
    action: str = "failed",
    outcome: placement.PlacementOutcome | None = None,
) -> Outcome:
    """Close the launch as failed (nothing rented); `backoff` given: a failed rental of
    (queue, provider) — of each provider in `outcome`, with its cause — which backs off; None:
    no failure of the rental (a rate limit, a cancel, a queue no longer autoscaled)."""
    drop_broker_user(rt, launch_id, queue)
    now = utc_now()
    with rt.transaction() as session:
        moves.move(session, launch_id, S.CREATING, S.FAILED, now, reason, worker_token_hash=None)
        details: dict[str, Any] = {"provider": provider}
        if backoff is not None and outcome is not None:
            _backoffs(session, queue, outcome, now, backoff)
            details.update(causes=_causes(outcome))
        elif backoff is not None:
            state = machines.rental_failed(session, queue, provider, now, backoff, reason)
            details.update(failures=state.failures, backoff_until=state.until.isoformat())
        kind = "drain" if action == "cancelled" else "launch"
        events.record(
            session,
            [events.event(kind, action, reason, queue=queue, launch_id=launch_id, details=details)],
            now,
        )
    log.warning("launch %s for %s failed: %s", launch_id, queue, reason)
    return Outcome(Kind.CANCELLED if action == "cancelled" else Kind.FAILED, f"failed: {reason}")


def _note(rt: Runtime, launch_id: str, queue: str, action: str, reason: str) -> None:
    with rt.transaction() as session:
        events.record(
            session,
            [events.event("launch", action, reason, queue=queue, launch_id=launch_id)],
            utc_now(),
        )


STEP = LaunchStep()
