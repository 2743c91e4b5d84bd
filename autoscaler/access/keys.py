"""Keys of the server API: admin and enrolment keys (a table) and per-launch worker tokens (a
column of the instance row). Only SHA-256 hex digests are stored; a key is shown once, when it
is made. Lookups go through the digest (a unique index) and are confirmed with a constant-time
compare, so a wrong key reveals nothing about a right one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from autoscaler.digits import ascii_whole
from autoscaler.lifecycle import TOKEN_STATES
from autoscaler.store import api_keys
from autoscaler.store.api_keys import KeyRecord
from autoscaler.store.instances import InstanceDetails

ADMIN = "admin"
ENROLMENT = "enrolment"
KINDS = (ADMIN, ENROLMENT)


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def derive(token: str, purpose: str) -> str:
    """A secret derived from a worker token (e.g. its broker password): the server recomputes
    it from the token the machine presents and stores nothing."""
    return hmac.new(token.encode("utf-8", "surrogatepass"), purpose.encode(), "sha256").hexdigest()


@dataclass(frozen=True)
class KeyInfo:
    id: int
    kind: str
    name: str
    created_at: datetime
    revoked_at: datetime | None
    queues: tuple[str, ...] = ()
    """An enrolment key's queues (none for an admin key, or an enrolment key made before keys
    were bound to queues: it opens no queue)."""

    def opens(self, queue: str) -> bool:
        return queue in self.queues


def _info(row: KeyRecord) -> KeyInfo:
    queues = tuple(str(q) for q in row.queues) if isinstance(row.queues, list) else ()
    return KeyInfo(row.id, row.kind, row.name, row.created_at, row.revoked_at, queues)


def create_key(
    session: Session, kind: str, name: str, now: datetime, queues: tuple[str, ...] = ()
) -> tuple[KeyInfo, str]:
    """A new key of `kind`: its record and the key itself (shown once, never stored). An
    enrolment key is bound to `queues` (at least one): its hand-made machine heartbeats for
    and deploys those alone."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}")
    name = name.strip()
    if not name or len(name) > 200:
        raise ValueError("a key needs a name of 1 to 200 characters")
    if kind == ENROLMENT and not queues:
        raise ValueError(
            "an enrolment key is bound to the queues its machine serves: give --queue Q "
            "(once per queue)"
        )
    if kind == ADMIN and queues:
        raise ValueError("an admin key opens every admin endpoint: it takes no --queue")
    key = f"asg{kind[0]}_{new_secret()}"
    bound = sorted(set(queues)) if queues else None
    return _info(api_keys.add(session, kind, name, digest(key), now, bound)), key


def list_keys(session: Session) -> list[KeyInfo]:
    return [_info(r) for r in api_keys.all_keys(session)]


def revoke_key(session: Session, ident: str, now: datetime) -> list[KeyInfo]:
    """Revoke the key with this id, or every live key with this name; returns those revoked."""
    number = ascii_whole(ident)
    return [_info(r) for r in api_keys.revoke(session, ident if number is None else number, now)]


def check_key(session: Session, key: str, kind: str) -> KeyInfo | None:
    """The live key of `kind` matching `key`, or None."""
    if not key:
        return None
    wanted = digest(key)
    row = api_keys.by_hash(session, wanted, kind)
    if row is None or row.revoked_at is not None or not hmac.compare_digest(row.key_hash, wanted):
        return None
    return _info(row)


def instance_of_token(session: Session, token: str) -> InstanceDetails | None:
    """The machine whose worker token this is, while the token is valid (see TOKEN_STATES)."""
    if not token:
        return None
    wanted = digest(token)
    row = api_keys.instance_by_token_hash(session, wanted)
    if row is None or row.worker_token_hash is None:
        return None
    if not hmac.compare_digest(row.worker_token_hash, wanted) or row.state not in TOKEN_STATES:
        return None
    return row


def revoke_worker_token(session: Session, launch_id: str) -> None:
    """Forget a machine's token hash (at destroy); the state rule revokes it already."""
    api_keys.forget_token(session, launch_id)
