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
  goes straight to terminating, and its destroy is enqueued);
- an ambiguous create (5xx or timeout after the request left) or any unexpected error once the
  provider may have been called: the row stays `creating`; reconcile looks the label up and
  adopts the machine, or fails the launch after a grace time. A create is never tried twice
  for one launch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autoscaler.access import broker_users, keys
from autoscaler.access.credentials import CredentialError
from autoscaler.control import drain, machines, placement, rate_limits
from autoscaler.control.runtime import Loaded, Runtime, log, utc_now
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


ENV_API_URL = "AUTOSCALER_API_URL"
ENV_WORKER_TOKEN = "AUTOSCALER_WORKER_TOKEN"


def machine_env(
    queue: str, loaded_queue: Any, api_url: str | None = None, token: str | None = None
) -> dict[str, str]:
    """What a rented machine is told: its queue, its deployment, the API URL and its own worker
    token (which opens the worker endpoints for this machine only). Never an admin key, a
    provider key, the vault key, a database or broker URL: the agent asks the API for its
    broker connection (a per-machine user where the broker allows one)."""
    env = {"AUTOSCALER_QUEUE": queue}
    if api_url:
        env[ENV_API_URL] = api_url
    if token:
        env[ENV_WORKER_TOKEN] = token
    deployment = getattr(loaded_queue, "deployment", None)
    if deployment is not None:
        env["AUTOSCALER_GIT_URL"] = deployment.git_url
        env["AUTOSCALER_STARTUP_CMD"] = deployment.startup_cmd
        if deployment.git_ref:
            env["AUTOSCALER_GIT_REF"] = deployment.git_ref
    return env


def run_launch(
    rt: Runtime, launch_id: str, enqueue: Callable[[str, str], None] | None = None
) -> str:
    """Carry out one launch intent; returns what happened (for the task's result). `enqueue`
    sends the destroy of a machine cancelled while its create was in flight (reconcile sends
    it too, later, if it is lost)."""
    now = utc_now()
    token = keys.new_secret()  # the machine's worker token: only its hash is stored
    with rt.transaction() as session:
        claimed = intents.claim_intent(session, launch_id, now, keys.digest(token))
        if not claimed:
            return "not pending (claimed already, or closed)"
        row = instances.get(session, launch_id)
        assert row is not None
        queue, provider_name, version = row.queue, row.provider, row.config_version
        names = tuple((row.placement or {}).get("providers") or (provider_name,))
        interruptible = bool(row.interruptible)
        # exactly what decide() judged: the config version of the decision, not the newest
        loaded = rt.load_version(session, version)
        install = rt.installation_id(session)
        boot_times, fallback_boot = boots.placement_boot_times(session, queue, now)
    if loaded is None and version is not None:
        why = f"config version {version}, which asked for it, no longer validates; nothing rented"
        return _fail(rt, launch_id, queue, provider_name, why, None)
    queue_cfg = loaded.config.queues.get(queue) if loaded else None
    auto = queue_cfg.autoscale if queue_cfg else None
    if loaded is None or auto is None or not auto.enabled:
        return _fail(rt, launch_id, queue, provider_name, "the queue is no longer autoscaled", None)
    outcome = placement.Outcome()
    providers = _usable(rt, loaded, names, outcome)
    if not providers:
        return _not_placed(rt, launch_id, queue, provider_name, outcome, loaded.config.backoff)
    if _cancel_requested(rt, launch_id):
        why = f"{drain.CANCELLED}: an operator drained it before its create; nothing was rented"
        return _fail(rt, launch_id, queue, provider_name, why, None, action="cancelled")
    unreachable = make_broker_user(rt, install, launch_id, queue, queue_cfg, token)
    if unreachable is not None:  # never a machine without the credentials it needs
        why = f"{unreachable}; nothing was rented (the machine could never have reached its queue)"
        return _fail(rt, launch_id, queue, provider_name, why, loaded.config.backoff)
    env = machine_env(queue, queue_cfg, rt.settings.api_url, token)
    launch = LaunchSpec.new(install, launch_id, env)

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
            boot_times,
            fallback_boot,
            before_create,
            outcome,
            interruptible=interruptible and auto.instance.interruptible is not None,
        )
    except AmbiguousCreateError as exc:
        why = f"{_text(exc, token)}; reconcile looks it up by label"
        _note(rt, launch_id, queue, "create_ambiguous", why)
        return "ambiguous: left to reconcile"
    except Exception as exc:  # the create may have left: treat as ambiguous, never re-create
        log.exception("launch %s: unexpected error; left to reconcile", launch_id)
        _note(rt, launch_id, queue, "create_ambiguous", f"unexpected {type(exc).__name__}")
        return "unexpected error: left to reconcile"
    finally:
        for name, limited in outcome.limited.items():
            rate_limits.note(rt, name, limited, queue)
    if outcome.placed is None:
        return _not_placed(rt, launch_id, queue, provider_name, outcome, loaded.config.backoff)
    return _booting(rt, launch_id, queue, auto, outcome, loaded.config.backoff, launch, enqueue)


def _usable(
    rt: Runtime, loaded: Loaded, names: tuple[str, ...], outcome: placement.Outcome
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
    auto: Any,
    outcome: placement.Outcome,
    backoff: Any,
    launch: LaunchSpec,
    enqueue: Callable[[str, str], None] | None,
) -> str:
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
        if enqueue is not None:
            enqueue("terminate", launch_id)
        return f"cancelled: {machine.provider_instance_id} is being destroyed"
    return f"booting: {machine.provider_instance_id} on {name}"


def _bid(offer: Any) -> bool:
    return offer.details.get("interruptible") is True


def _causes(outcome: placement.Outcome) -> dict[str, str]:
    return {name: cause for name, (cause, _) in outcome.failures.items()}


def _backoffs(session: Any, queue: str, outcome: placement.Outcome, now: Any, backoff: Any) -> None:
    """Each provider that failed this launch backs off on its own (queue, provider)."""
    for name, (cause, text) in outcome.failures.items():
        machines.rental_failed(session, queue, name, now, backoff, text, cause)


def _not_placed(
    rt: Runtime,
    launch_id: str,
    queue: str,
    provider: str,
    outcome: placement.Outcome,
    backoff: Any,
) -> str:
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


def make_broker_user(
    rt: Runtime, install: str, launch_id: str, queue: str, queue_cfg: Any, token: str
) -> str | None:
    """Make this launch's own broker user (`create_broker_user`) and record it on the row so
    terminate deletes it. Returns why it could not be made where one is needed."""
    user, unreachable = create_broker_user(rt, install, launch_id, queue, queue_cfg, token)
    if user is not None:
        with rt.transaction() as session:
            moves.set_broker_user(session, launch_id, user)
    return unreachable


def remake_broker_user(
    rt: Runtime, session: Session, machine: InstanceDetails, queue_cfg: Any, token: str
) -> str | None:
    """A machine resumed from a warm pool: its broker user, deleted while it was stopped, is
    made again from the token it presents (the server keeps only the token's hash) and recorded
    on its row, in `session`. The user made, or None (logged)."""
    install = rt.installation_id(session)
    launch_id = machine.launch_id
    user, why = create_broker_user(rt, install, launch_id, machine.queue, queue_cfg, token)
    if user is not None:
        moves.set_broker_user(session, launch_id, user)
    elif why is not None:
        log.warning("resumed %s has no broker user yet: %s", launch_id, why)
    return user


def create_broker_user(
    rt: Runtime, install: str, launch_id: str, queue: str, queue_cfg: Any, token: str
) -> tuple[str | None, str | None]:
    """Make a launch's own broker user where the watched broker allows it (Redis ≥ 6), its
    password derived from the worker token: at the launch, and again when a machine resumed
    from the warm pool asks for its deployment (its user was deleted while it was stopped).
    Only when AUTOSCALER_API_URL is set: the machine learns its user from the API alone.
    Returns (the user made, or None; why none could be made where one is needed — the broker
    down: a launch then fails into backoff rather than rent a machine that could never work)."""
    if not rt.settings.api_url_set:
        return None, None
    try:
        plan = broker_users.plan_for(queue_cfg.metrics, queue, rt.env)
    except broker_users.BrokerUnreachable as exc:
        return None, f"no broker user could be made: {exc}"
    except broker_users.NoBrokerUser:
        return None, None  # this broker has no per-machine users: the deployment says so
    user = plan.user(install, launch_id)
    try:
        broker_users.create_user(plan, user, keys.derive(token, "broker"))
    except Exception as exc:
        log.warning("%s: no broker user (%s)", launch_id, type(exc).__name__)
        return None, (
            f"no broker user could be made: the watched broker refused ({type(exc).__name__})"
        )
    return user, None


def drop_broker_user(rt: Runtime, launch_id: str, queue: str) -> bool:
    """Delete the machine's broker user, if it has one (a launch that failed for sure; a machine
    going to the warm pool). True when none is left; False when it could not be deleted (logged:
    the caller decides whether to go on)."""
    with rt.transaction() as session:
        row = instances.get(session, launch_id)
        user = row.broker_user if row is not None else None
        loaded = rt.load_for(session, row.config_version if row is not None else None)
    queue_cfg = loaded.config.queues.get(queue) if loaded else None
    if not user:
        return True
    try:
        if queue_cfg is None or not broker_users.delete_machine_user(
            queue_cfg.metrics, user, rt.env
        ):
            raise ValueError("its queue's broker is no longer one we make users on")
    except Exception as exc:
        log.error("%s: its broker user %s is not deleted: %s", launch_id, user, exc)
        return False
    with rt.transaction() as session:
        moves.set_broker_user(session, launch_id, None)
    return True


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
    outcome: placement.Outcome | None = None,
) -> str:
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
    return f"failed: {reason}"


def _note(rt: Runtime, launch_id: str, queue: str, action: str, reason: str) -> None:
    with rt.transaction() as session:
        events.record(
            session,
            [events.event("launch", action, reason, queue=queue, launch_id=launch_id)],
            utc_now(),
        )
