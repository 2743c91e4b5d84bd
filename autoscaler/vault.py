"""Provider credentials encrypted at rest (Fernet), with key rotation (MultiFernet).

The key comes from AUTOSCALER_VAULT_KEY (comma-separated: the first encrypts, all decrypt) or
from AUTOSCALER_VAULT_KEY_FILE (one key per line, same order). There is no fallback to
plaintext: a missing or wrong key is an error that says how to fix it.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from autoscaler.settings import Settings
from autoscaler.textfile import TextFileError, read_text

KEY_HELP = (
    "generate a key with 'autoscaler vault generate-key' and set AUTOSCALER_VAULT_KEY to it "
    "(or AUTOSCALER_VAULT_KEY_FILE to a file holding it)"
)


class VaultError(Exception):
    """The vault cannot do what was asked; the message says why and how to fix it."""


def generate_key() -> str:
    return Fernet.generate_key().decode()


def _parse_keys(raw: str, where: str) -> list[Fernet]:
    keys = [k.strip() for k in raw.replace("\n", ",").split(",") if k.strip()]
    if not keys:
        raise VaultError(f"{where} holds no key; {KEY_HELP}")
    fernets = []
    for i, key in enumerate(keys, 1):
        try:
            fernets.append(Fernet(key.encode()))
        except (ValueError, TypeError):
            raise VaultError(
                f"key #{i} in {where} is not a Fernet key (32 url-safe base64-encoded bytes); "
                f"{KEY_HELP}"
            ) from None
    return fernets


class Vault:
    def __init__(self, fernets: list[Fernet]) -> None:
        if not fernets:
            raise VaultError(f"no vault key is configured; {KEY_HELP}")
        self._multi = MultiFernet(fernets)

    def __repr__(self) -> str:
        return "Vault(<keys hidden>)"

    @classmethod
    def from_settings(cls, settings: Settings) -> Vault:
        if settings.vault_key:
            return cls(_parse_keys(settings.vault_key, "AUTOSCALER_VAULT_KEY"))
        if settings.vault_key_file:
            path = Path(settings.vault_key_file)
            try:  # a regular UTF-8 file of at most 64 KiB: never a FIFO, a device or binary
                raw = read_text(path, limit=64 * 1024, what="a key file")
            except TextFileError as exc:
                raise VaultError(
                    f"AUTOSCALER_VAULT_KEY_FILE {path} {exc.cause}; {KEY_HELP}"
                ) from None
            return cls(_parse_keys(raw, f"AUTOSCALER_VAULT_KEY_FILE {path}"))
        raise VaultError(f"no vault key is configured; {KEY_HELP}")

    def encrypt(self, secret: str) -> bytes:
        return self._multi.encrypt(secret.encode())

    def decrypt(self, token: bytes, what: str = "a stored secret") -> str:
        try:
            return self._multi.decrypt(token).decode()
        except InvalidToken:
            raise VaultError(
                f"{what} cannot be decrypted with the configured vault key(s); set "
                "AUTOSCALER_VAULT_KEY to the key it was stored with (during a rotation: "
                "'NEW,OLD'), or store the credential again"
            ) from None

    def rotate(self, token: bytes, what: str = "a stored secret") -> bytes:
        """Re-encrypt under the first key; refuses (changes nothing) if no key can read it."""
        try:
            return self._multi.rotate(token)
        except InvalidToken:
            raise VaultError(
                f"{what} cannot be decrypted with any configured key, so it cannot be rotated; "
                "set AUTOSCALER_VAULT_KEY to 'NEW,OLD' where OLD is the key it was stored with"
            ) from None
