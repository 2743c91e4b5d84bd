"""What a machine holds: the launch mints its worker token (only the hash is stored) and puts
in its environment only its queue, its label, the API URL, its token and the deployment —
never an admin key, a provider key, the vault key, a database or broker URL. Where the watched
broker is Redis ≥ 6 the launch makes the machine's own ACL user (limited to its queue's keys);
the machine's deployment answer carries that user, and destroy deletes it and kills the token."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from autoscaler.access import keys
from autoscaler.control.runtime import Runtime
from autoscaler.control.steps import launch, terminate
from autoscaler.control.steps.frame import Kind, run_step
from autoscaler.lifecycle import InstanceState as S
from autoscaler.providers.labels import make_label
from autoscaler.settings import Settings
from autoscaler.store import config_versions, instances, intents, migrate, moves
from tests.api.apikit import REDIS
from tests.control.outbox import RecordingOutbox

ALLOWED = {
    "AUTOSCALER_QUEUE",
    "AUTOSCALER_API_URL",
    "AUTOSCALER_WORKER_TOKEN",
    "AUTOSCALER_GIT_URL",
    "AUTOSCALER_GIT_REF",
    "AUTOSCALER_STARTUP_CMD",
    "AUTOSCALER_INSTALLATION_ID",
    "AUTOSCALER_LAUNCH_ID",
    "AUTOSCALER_AGENT_WORKDIR",  # its own folder, kept while a warm pool holds it stopped
    "AUTOSCALER_LABEL",
}


@pytest.mark.timeout(60)
def test_machine_env_holds_only_its_own_token_and_the_acl_user_dies_with_it(
    sqlite_url, tmp_path: Path, monkeypatch
):
    secrets_here = {
        "AUTOSCALER_VAULT_KEY": "vault-key-secret-123",
        "RUNPOD_API_KEY": "provider-key-secret-456",
        "AUTOSCALER_ADMIN_KEY": "admin-key-secret-789",
        "AUTOSCALER_DATABASE_URL": sqlite_url,
        "AUTOSCALER_HOME": str(tmp_path / "home"),
        "AUTOSCALER_API_URL": "http://127.0.0.1:9",
    }
    for k, v in secrets_here.items():
        monkeypatch.setenv(k, v)
    migrate.upgrade(sqlite_url)
    out = tmp_path / "machine-env.txt"
    queue = f"envq-{time.time_ns()}"
    config = {
        "poll_interval": 5,
        "providers": {"desk": {"kind": "local", "command": f"env > {out}; exec sleep 30"}},
        "queues": {
            queue: {
                "deployment": {"git_url": "file:///x.git", "startup_cmd": "true"},
                "metrics": {"source": "celery", "url": f"{REDIS}/11"},
                "autoscale": {
                    "provider": "desk",
                    "max_workers": 1,
                    "scale_up": [{"trigger": "no_workers"}],
                    "scale_down": [{"trigger": "idle", "timeout": "5m"}],
                    "instance": {"gpu": "RTX 4090", "max_price_per_hour": 1.0},
                },
            }
        },
    }
    rt = Runtime(Settings.from_env())
    admin = redis.Redis.from_url(f"{REDIS}/11")
    user = "asg-?-envtest1"
    try:
        now = datetime.now(UTC)
        with rt.transaction() as session:
            user = make_label(rt.installation_id(session), "envtest1")
            config_versions.record(session, config, "test", now, None)
            intents.add_intents(session, [("envtest1", queue, "desk", "test")], now)
        assert run_step(launch.STEP, rt, "envtest1").kind is Kind.DONE, rt
        deadline = time.monotonic() + 10
        while not (out.exists() and out.read_text()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
        ours = {k for k in env if k.startswith("AUTOSCALER_")}
        assert ours <= ALLOWED, ours - ALLOWED
        blob = out.read_text()
        for secret in secrets_here.values():
            if secret not in (secrets_here["AUTOSCALER_HOME"], "http://127.0.0.1:9"):
                assert secret not in blob
        assert "RUNPOD_API_KEY" not in env and "redis://" not in blob
        token = env["AUTOSCALER_WORKER_TOKEN"]
        with rt.transaction() as session:
            row = instances.get(session, "envtest1")
            assert row is not None
            assert row.worker_token_hash == keys.digest(token)
            assert row.broker_user == user
        # the per-machine ACL user exists, with the queue's keys only
        rules = admin.execute_command("ACL", "GETUSER", user)
        text = str(rules)
        assert (
            queue in text
            and "unacked" in text
            and "-@all" in str(admin.execute_command("ACL", "LIST"))
        )
        # it can read its queue and cannot read another key
        password = keys.derive(token, "broker")
        mine = redis.Redis.from_url(f"{REDIS}/11", username=user, password=password)
        mine.llen(queue)
        with pytest.raises(redis.exceptions.NoPermissionError):
            mine.get("some-other-key")
        with pytest.raises(redis.exceptions.NoPermissionError):
            mine.keys("*")
        mine.close()
        # destroy: token dead, user gone
        with rt.transaction() as session:
            moves.move(session, "envtest1", S.BOOTING, S.TERMINATING, datetime.now(UTC), "t")
        assert run_step(terminate.STEP, rt, "envtest1").kind is Kind.DONE
        with rt.transaction() as session:
            row = instances.get(session, "envtest1")
            assert row is not None and row.worker_token_hash is None and row.broker_user is None
            assert keys.instance_of_token(session, token) is None
        assert user not in str(admin.execute_command("ACL", "USERS"))
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()
        rt.close()


@pytest.mark.timeout(60)
def test_a_failed_launch_leaves_no_broker_user_and_no_token(
    sqlite_url, tmp_path: Path, monkeypatch
):
    monkeypatch.setenv("AUTOSCALER_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("AUTOSCALER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AUTOSCALER_API_URL", "http://127.0.0.1:9")
    migrate.upgrade(sqlite_url)
    queue = f"failq-{time.time_ns()}"
    config = {
        "poll_interval": 5,
        # dearer than the queue's cap: no offer, the launch fails for sure
        "providers": {"desk": {"kind": "local", "command": "exec sleep 30", "price_per_hour": 0.5}},
        "queues": {
            queue: {
                "metrics": {"source": "celery", "url": f"{REDIS}/11"},
                "autoscale": {
                    "provider": "desk",
                    "max_workers": 1,
                    "scale_up": [{"trigger": "no_workers"}],
                    "scale_down": [{"trigger": "idle", "timeout": "5m"}],
                    "instance": {"gpu": "RTX 4090", "max_price_per_hour": 0.4},
                },
            }
        },
    }
    rt = Runtime(Settings.from_env())
    admin = redis.Redis.from_url(f"{REDIS}/11", decode_responses=True)
    user = "asg-?-failtest1"
    try:
        with rt.transaction() as session:
            user = make_label(rt.installation_id(session), "failtest1")
            config_versions.record(session, config, "test", datetime.now(UTC), None)
            intents.add_intents(session, [("failtest1", queue, "desk", "test")], datetime.now(UTC))
        assert run_step(launch.STEP, rt, "failtest1").kind is Kind.FAILED, "the launch should fail"
        with rt.transaction() as session:
            row = instances.get(session, "failtest1")
            assert row is not None and row.state == S.FAILED
            assert row.broker_user is None and row.worker_token_hash is None
        assert user not in admin.execute_command("ACL", "USERS")
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()
        rt.close()


@pytest.mark.timeout(60)
def test_reconcile_sweeps_broker_users_of_machines_no_longer_live(
    sqlite_url, tmp_path: Path, monkeypatch
):
    from autoscaler.brokers import users as broker_users
    from autoscaler.config.metrics_sources import CelerySource
    from autoscaler.control.reconciler import run_reconcile
    from tests.api.apikit import CONFIG

    monkeypatch.setenv("AUTOSCALER_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("AUTOSCALER_HOME", str(tmp_path / "home"))
    migrate.upgrade(sqlite_url)
    rt = Runtime(Settings.from_env())
    admin = redis.Redis.from_url(f"{REDIS}/11", decode_responses=True)
    users: list[str] = []
    try:
        now = datetime.now(UTC)
        with rt.transaction() as session:
            install = rt.installation_id(session)
            config_versions.record(session, CONFIG, "test", now, None)
            intents.add_intents(
                session, [("gone1", "q1", "sandbox", "t"), ("live1", "q1", "sandbox", "t")], now
            )
            moves.move(session, "gone1", S.PENDING, S.CREATING, now, "t")
            moves.move(session, "gone1", S.CREATING, S.FAILED, now, "t")
        plan = broker_users.plan_for(
            CelerySource.model_validate(CONFIG["queues"]["q1"]["metrics"]), "q1"
        )
        gone, live = make_label(install, "gone1"), make_label(install, "live1")
        theirs = make_label("0" * 12, "gone1")  # another installation's: never ours to delete
        users = [gone, live, theirs]
        for u in users:
            broker_users.create_user(plan, u, "pw")
        run_reconcile(rt, RecordingOutbox())
        now_users = set(admin.execute_command("ACL", "USERS"))
        assert gone not in now_users
        assert live in now_users and theirs in now_users
    finally:
        for u in users:
            admin.execute_command("ACL", "DELUSER", u)
        admin.close()
        rt.close()
