"""`autoscaler keys …`: the admin keys (every admin endpoint) and the enrolment keys
(hand-made machines' agents) the server API checks. Only a key's SHA-256 is stored."""

from __future__ import annotations

from datetime import UTC, datetime

import click

from autoscaler.access import keys as api_keys
from autoscaler.boundary import Refused
from autoscaler.cli.common import sessions, settings
from autoscaler.store.db import transaction


@click.group("keys")
def keys() -> None:
    """Admin keys (every admin endpoint) and enrolment keys (hand-made machines' agents).

    A key is printed once, when it is made; only its SHA-256 is stored."""


def _create(kind: str, name: str, queues: tuple[str, ...] = ()) -> None:
    try:
        with transaction(sessions(settings())) as session:
            info, key = api_keys.create_key(session, kind, name, datetime.now(UTC), queues)
    except ValueError as exc:
        raise Refused(str(exc)) from None
    bound = f" for {', '.join(info.queues)}" if info.queues else ""
    click.echo(
        f"{kind} key {info.id} ({info.name}){bound} created; it is shown once, keep it secret:"
    )
    click.echo(key)


@keys.command("create-admin")
@click.option("--name", required=True, help="Who or what holds it (shown by 'keys list').")
def create_admin(name: str) -> None:
    """A new admin key."""
    _create(api_keys.ADMIN, name)


@keys.command("create-enrolment")
@click.option("--name", required=True, help="Which hand-made machine(s) will use it.")
@click.option(
    "--queue",
    "queues",
    multiple=True,
    help="A queue its machine serves (repeat for several): the key opens those alone.",
)
def create_enrolment(name: str, queues: tuple[str, ...]) -> None:
    """A new enrolment key for a hand-made machine's agent, bound to its queues: it heartbeats
    for and fetches the deployment of those queues only."""
    _create(api_keys.ENROLMENT, name, queues)


@keys.command("list")
def list_keys() -> None:
    """Every key: id, kind, name, created, revoked (never the key)."""
    with transaction(sessions(settings())) as session:
        rows = api_keys.list_keys(session)
    if not rows:
        click.echo("no key yet; make one with 'autoscaler keys create-admin --name NAME'")
    for r in rows:
        revoked = (
            f"revoked {r.revoked_at.isoformat(timespec='seconds')}" if r.revoked_at else "live"
        )
        opens = ""
        if r.kind == api_keys.ENROLMENT:
            opens = "\t" + (
                f"queues {', '.join(r.queues)}"
                if r.queues
                else "no queue (made before keys were bound to queues: make a new one)"
            )
        click.echo(
            f"{r.id}\t{r.kind}\t{r.name}\tcreated {r.created_at.isoformat(timespec='seconds')}"
            f"\t{revoked}{opens}"
        )


@keys.command("revoke")
@click.argument("key_id_or_name")
def revoke(key_id_or_name: str) -> None:
    """Revoke the key with this id, or every live key with this name."""
    with transaction(sessions(settings())) as session:
        done = api_keys.revoke_key(session, key_id_or_name, datetime.now(UTC))
    if not done:
        raise Refused(f"no live key with id or name {key_id_or_name!r} ('autoscaler keys list')")
    for r in done:
        click.echo(f"{r.kind} key {r.id} ({r.name}) revoked")
