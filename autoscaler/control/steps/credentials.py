"""What a rented machine holds, and nothing more: its environment (queue, deployment, the API URL
and its own worker token) and, where the watched broker allows it, a broker user of its own.
Made by the launch step, dropped by the stop step and terminate, made again when a machine
resumed from a warm pool asks for its deployment (`api/routers/worker.py`)."""

from __future__ import annotations

from typing import Any

from autoscaler.access import keys
from autoscaler.brokers import users as broker_users
from autoscaler.control.runtime import Runtime, log
from autoscaler.store import instances, moves
from autoscaler.store.db import Session
from autoscaler.store.instances import InstanceDetails

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
