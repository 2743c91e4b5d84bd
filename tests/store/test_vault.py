"""Provider keys are encrypted at rest, rotate under a new key, and a wrong key never reads."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from autoscaler.access.credentials import CredentialError, resolve_api_key, validate_provider
from autoscaler.settings import Settings
from autoscaler.store import providers as store
from autoscaler.store.db import transaction
from autoscaler.vault import Vault, VaultError, generate_key
from tests.store.helpers import vault_of

SECRET = "rpa_SECRET_9f8e7d6c5b4a-should-never-be-stored-in-clear"


def test_round_trip():
    vault = vault_of(generate_key())
    token = vault.encrypt(SECRET)
    assert SECRET.encode() not in token
    assert vault.decrypt(token) == SECRET


def test_wrong_key_is_a_clear_error_never_plaintext():
    token = vault_of(generate_key()).encrypt(SECRET)
    with pytest.raises(VaultError) as exc:
        vault_of(generate_key()).decrypt(token, "the credentials of provider 'rp'")
    message = str(exc.value)
    assert "provider 'rp'" in message and "AUTOSCALER_VAULT_KEY" in message
    assert SECRET not in message


def test_missing_or_malformed_key_is_refused(tmp_path):
    with pytest.raises(VaultError, match="no vault key is configured"):
        Vault.from_settings(Settings.from_env({"AUTOSCALER_HOME": str(tmp_path)}))
    with pytest.raises(VaultError, match="not a Fernet key"):
        Vault.from_settings(Settings.from_env({"AUTOSCALER_VAULT_KEY": "hunter2"}))
    with pytest.raises(VaultError, match="cannot be read"):
        Vault.from_settings(
            Settings.from_env({"AUTOSCALER_VAULT_KEY_FILE": str(tmp_path / "absent")})
        )


def test_key_file_with_several_keys(tmp_path):
    new, old = generate_key(), generate_key()
    token = vault_of(old).encrypt(SECRET)
    (tmp_path / "keys").write_text(f"{new}\n{old}\n")
    vault = Vault.from_settings(
        Settings.from_env({"AUTOSCALER_VAULT_KEY_FILE": str(tmp_path / "keys")})
    )
    assert vault.decrypt(token) == SECRET
    assert vault_of(new).decrypt(vault.rotate(token)) == SECRET
    assert repr(vault) == "Vault(<keys hidden>)"


def test_rotation_in_the_store_and_no_plaintext_at_rest(sessions, engine):
    old, new = generate_key(), generate_key()
    with transaction(sessions) as s:
        store.add_provider(s, "rp", "runpod", {}, vault_of(old).encrypt(SECRET))
    with engine.connect() as conn:
        raw = conn.execute(text("SELECT * FROM providers")).all()
    assert (
        raw
        and SECRET not in repr(raw)
        and SECRET.encode()
        not in b"".join(bytes(v) for row in raw for v in row if isinstance(v, bytes | memoryview))
    )

    both = vault_of(new, old)
    with transaction(sessions) as s:
        row = store.get_provider(s, "rp")
        assert row is not None and row.credentials_encrypted is not None
        assert store.set_credentials(s, "rp", both.rotate(row.credentials_encrypted))
        assert not store.set_credentials(s, "nobody", None)
    with transaction(sessions) as s:
        row = store.get_provider(s, "rp")
        assert row is not None and row.credentials_encrypted is not None
        assert vault_of(new).decrypt(row.credentials_encrypted) == SECRET
        with pytest.raises(VaultError):
            vault_of(old).decrypt(row.credentials_encrypted)


def test_resolve_api_key_from_vault_env_or_refusal():
    key = generate_key()
    rp = validate_provider("rp", "runpod", {})
    token = vault_of(key).encrypt(SECRET)
    assert resolve_api_key("rp", rp, token, lambda: vault_of(key), {}) == SECRET
    env_rp = validate_provider("rp", "runpod", {"api_key_env": "RP_KEY"})
    assert resolve_api_key("rp", env_rp, None, lambda: vault_of(key), {"RP_KEY": "k"}) == "k"
    with pytest.raises(CredentialError, match=r"\$RP_KEY, which is not set"):
        resolve_api_key("rp", env_rp, None, lambda: vault_of(key), {})
    with pytest.raises(CredentialError, match="has no API key"):
        resolve_api_key("rp", rp, None, lambda: vault_of(key), {})
    mock = validate_provider("m", "mock", {})
    assert resolve_api_key("m", mock, None, lambda: vault_of(key), {}) is None
