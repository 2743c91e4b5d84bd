"""From `providers add --api-key-stdin` to a request: the key travels encrypted, never shown."""

from __future__ import annotations

import uuid

import pytest
from click.testing import CliRunner

from autoscaler.access.credentials import registered_provider_configs, resolve_api_key
from autoscaler.cli import main
from autoscaler.providers.base import AuthError, LaunchSpec, create_on_first_offer
from autoscaler.providers.registry import build_provider
from autoscaler.settings import Settings
from autoscaler.store import providers as store
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.installation import installation_id
from autoscaler.vault import Vault, generate_key
from tests.fakes.runpod_server import FakeRunPod
from tests.fakes.vast_server import FakeVast
from tests.store.helpers import vault_of

from .conftest import SECRET, VAST_SECRET, assert_no_secret, spec


@pytest.mark.parametrize("kind", ["runpod", "vast"])
def test_key_from_the_vault_reaches_the_provider_and_nowhere_else(kind, db_url, tmp_path, all_logs):
    fake = FakeRunPod(SECRET) if kind == "runpod" else FakeVast(VAST_SECRET)
    secret = SECRET if kind == "runpod" else VAST_SECRET
    env = {
        "AUTOSCALER_HOME": str(tmp_path),
        "AUTOSCALER_DATABASE_URL": db_url,
        "AUTOSCALER_VAULT_KEY": generate_key(),
    }
    runner = CliRunner()
    try:
        assert runner.invoke(main, ["db", "upgrade"], env=env).exit_code == 0
        options = ["--option", f"base_url={fake.url}"]
        if kind == "runpod":
            options += ["--option", 'gpu_types=["NVIDIA GeForce RTX 4090"]']
        added = runner.invoke(
            main,
            ["providers", "add", "gpu", "--kind", kind, "--api-key-stdin", *options],
            env=env,
            input=secret + "\n",
        )
        assert added.exit_code == 0, added.output
        listed = runner.invoke(main, ["providers", "list"], env=env)
        assert secret not in added.output + listed.output

        settings = Settings.from_env(env)
        engine = make_engine(db_url)
        sessions = session_factory(engine)
        with transaction(sessions) as s:
            config = registered_provider_configs(s)["gpu"]
            row = store.get_provider(s, "gpu")
            assert row is not None and row.credentials_encrypted is not None
            key = resolve_api_key(
                "gpu", config, row.credentials_encrypted, lambda: Vault.from_settings(settings), env
            )
            inst = installation_id(s)
        provider = build_provider(
            "gpu", config, credential=key, installation_id=inst, sessions=sessions
        )
        launch = LaunchSpec.new(inst, uuid.uuid4().hex, {"QUEUE": "q"})
        machine = create_on_first_offer(
            provider, provider.find_offers(spec(max_price_per_hour=1.0)), launch
        )
        assert [m.label for m in provider.list_owned()] == [machine.label]
        provider.destroy(machine.provider_instance_id)
        assert fake.requests and all(r.authorization == f"Bearer {secret}" for r in fake.requests)
        assert_no_secret(all_logs, provider, machine, secret=secret)

        # the same stored key read with another vault key is refused, never sent in clear
        wrong = vault_of(generate_key())
        with pytest.raises(Exception) as exc:
            resolve_api_key("gpu", config, row.credentials_encrypted, lambda: wrong, env)
        assert secret not in str(exc.value) and "cannot be decrypted" in str(exc.value)
        engine.dispose()
    finally:
        fake.close()
    assert fake.spec_violations == []


def test_a_provider_without_a_key_is_refused_before_any_request(sessions):
    fake = FakeRunPod(SECRET)
    try:
        with transaction(sessions) as s:
            inst = installation_id(s)
        from autoscaler.config.provider_options import RunPodOptions

        cfg = RunPodOptions(kind="runpod", base_url=fake.url)
        with pytest.raises(AuthError):
            build_provider("gpu", cfg, credential=None, installation_id=inst, sessions=sessions)
        assert fake.requests == []
    finally:
        fake.close()
