"""A small world for the API tests: a migrated store, one applied config, two live machines and
one destroyed one (each with its worker token), admin and enrolment keys (live and revoked)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi.testclient import TestClient

from autoscaler.access import keys
from autoscaler.api.app import create_app
from autoscaler.control.runtime import Runtime
from autoscaler.lifecycle import InstanceState
from autoscaler.settings import Settings
from autoscaler.store import config_versions, events, instances, intents, migrate
from autoscaler.store.instances import InstanceDetails
from autoscaler.store.models import Instance

REDIS = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379")
S = InstanceState

CONFIG: dict[str, Any] = {
    "poll_interval": 5,
    "providers": {"sandbox": {"kind": "mock", "boot_delay": 1, "price_per_hour": 0.1}},
    "queues": {
        "q1": {
            "deployment": {
                "git_url": "file:///nowhere/repo.git",
                "git_ref": "main",
                "startup_cmd": "celery -A tasks worker",
            },
            "metrics": {"source": "celery", "url": f"{REDIS}/11"},
            "autoscale": {
                "provider": "sandbox",
                "max_workers": 3,
                "scale_up": [{"trigger": "no_workers"}],
                "scale_down": [{"trigger": "idle", "timeout": "5m"}],
                "instance": {"gpu": "RTX 4090", "max_price_per_hour": 1.0},
            },
        }
    },
}


@dataclass
class World:
    rt: Runtime
    client: TestClient
    tokens: dict[str, str] = field(default_factory=dict)  # launch id -> token
    admin: str = ""
    admin_revoked: str = ""
    enrolment: str = ""
    enrolment_revoked: str = ""

    def h(self, key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if key is not None else {}

    def row(self, launch_id: str) -> InstanceDetails:
        with self.rt.transaction() as session:
            row = instances.get(session, launch_id)
            assert row is not None
            return row

    def set_state(self, launch_id: str, state: InstanceState) -> None:
        from sqlalchemy import update

        with self.rt.transaction() as session:
            session.execute(
                update(Instance).where(Instance.launch_id == launch_id).values(state=state)
            )

    def close(self) -> None:
        self.client.close()
        self.rt.close()


def add_machine(rt: Runtime, launch_id: str, state: InstanceState, queue: str = "q1") -> str:
    token = keys.new_secret()
    now = datetime.now(UTC)
    with rt.transaction() as session:
        intents.add_intents(session, [(launch_id, queue, "sandbox", "test")], now)
        from sqlalchemy import update

        session.execute(
            update(Instance)
            .where(Instance.launch_id == launch_id)
            .values(state=state, worker_token_hash=keys.digest(token), price_per_hour=0.1)
        )
    return token


def add_warm_pool(world: World, size: int = 2, keep_for: float = 3600.0) -> int:
    """A new config version giving q1 a warm pool; its version number."""
    import copy

    document = copy.deepcopy(CONFIG)
    document["queues"]["q1"]["autoscale"]["warm_pool"] = {"size": size, "keep_for": keep_for}
    with world.rt.transaction() as session:
        row = config_versions.record(session, document, "test", datetime.now(UTC), "warm pool")
        assert row is not None
        return row.version


def stop_machine(world: World, launch_id: str, storage: float | None, stopped_at: datetime) -> None:
    """A machine of q1 put in its warm pool: stopped since `stopped_at`, its storage $/h."""
    from sqlalchemy import update

    with world.rt.transaction() as session:
        session.execute(
            update(Instance)
            .where(Instance.launch_id == launch_id)
            .values(
                state=S.STOPPED,
                stopping_at=stopped_at,
                stopped_at=stopped_at,
                storage_price_per_hour=storage,
                keep_warm=True,
                running_tasks=0,
            )
        )


def warm_events(world: World, *actions: str, queue: str = "q1") -> None:
    """Warm pool events (hit, miss, …) of `queue`, now, as the lifecycle records them."""
    with world.rt.transaction() as session:
        events.record(
            session,
            [events.warm_event(a, f"test: {a}", queue, f"w-{i}") for i, a in enumerate(actions)],
            datetime.now(UTC),
        )


def make_world(db_url: str, tmp_path: Any) -> World:
    migrate.upgrade(db_url)
    env = {
        "AUTOSCALER_DATABASE_URL": db_url,
        "AUTOSCALER_HOME": str(tmp_path / "home"),
        "AUTOSCALER_BROKER_URL": f"{REDIS}/13",
    }
    settings = Settings.from_env(env)
    rt = Runtime(settings, env=env)
    now = datetime.now(UTC)
    with rt.transaction() as session:
        config_versions.record(session, CONFIG, "test", now, "first")
    world = World(rt=rt, client=TestClient(create_app(rt), raise_server_exceptions=False))
    world.tokens["m1"] = add_machine(rt, "m1", S.READY)
    world.tokens["m2"] = add_machine(rt, "m2", S.READY)
    world.tokens["gone"] = add_machine(rt, "gone", S.TERMINATED)
    with rt.transaction() as session:
        _, world.admin = keys.create_key(session, keys.ADMIN, "ops", now)
        info, world.admin_revoked = keys.create_key(session, keys.ADMIN, "old", now)
        keys.revoke_key(session, str(info.id), now)
        _, world.enrolment = keys.create_key(session, keys.ENROLMENT, "desk", now, ("q1",))
        info, world.enrolment_revoked = keys.create_key(
            session, keys.ENROLMENT, "olddesk", now, ("q1",)
        )
        keys.revoke_key(session, str(info.id), now)
    return world
