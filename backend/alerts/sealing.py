"""Webhook credentials at rest: sealed with AES-256-GCM (``cryptography``), never in clear.

    configure(settings)                # once per process; create_app does it
    stored = seal("whsec_…")           # 'enc:v1:…': what the database holds
    unseal(stored)                     # 'whsec_…'; a value stored in clear comes back as is

What is sealed: a receiver's signing secret and the values of its extra headers (e.g.
``Authorization``). ``WebhookReceiver.secret`` and ``.headers`` seal and unseal on the way,
so the rest of the code sees the real values.

Format: ``enc:v1:`` + base64url(12-byte random nonce ‖ ciphertext ‖ 16-byte tag); the
associated data names the purpose, so a sealed value cannot be replayed as another kind.
The AES key is HKDF-SHA256 of the key material:

1. ``VIGIL_SECRET_KEY`` (any long random string, e.g. ``openssl rand -base64 32``);
   ``VIGIL_SECRET_KEY_PREVIOUS`` (comma-separated) still opens what older keys sealed;
2. unset, with a SQLite file: a key generated once and kept next to the database in
   ``<database>.key``, mode 0600 (a laptop needs nothing configured; back it up with it);
3. otherwise (PostgreSQL, in-memory SQLite): derived from the admin token, with a warning:
   changing ``VIGIL_ADMIN_TOKEN`` would then make stored secrets unreadable.

Production and distributed installs without ``VIGIL_SECRET_KEY`` log a warning at start.
Rows written in clear by older versions are read as they are and sealed on their next change.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import stat
import time
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from sqlalchemy import make_url

from backend.settings import DEV_ADMIN_TOKEN, Settings, get_settings

log = logging.getLogger(__name__)

PREFIX = "enc:v1:"
NONCE_BYTES = 12
PURPOSE = b"vigil webhook credential v1"


class SecretUnreadable(RuntimeError):
    """A sealed value none of the configured keys opens (the key changed)."""


def _aes_key(material: str) -> AESGCM:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"vigil secret key v1")
    return AESGCM(hkdf.derive(material.encode()))


class Keyring:
    """Seals with the first key; opens with any of them."""

    def __init__(self, materials: list[str], source: str) -> None:
        if not materials:
            raise ValueError("a keyring needs at least one key")
        self.source = source
        self._keys = [_aes_key(m) for m in materials]

    def seal(self, plain: str) -> str:
        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = self._keys[0].encrypt(nonce, plain.encode(), PURPOSE)
        return PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode()

    def unseal(self, stored: str) -> str:
        if not is_sealed(stored):
            return stored  # written in clear by an older version
        try:
            raw = base64.urlsafe_b64decode(stored[len(PREFIX) :].encode())
        except ValueError:
            raise SecretUnreadable("a sealed webhook credential is damaged") from None
        nonce, sealed = raw[:NONCE_BYTES], raw[NONCE_BYTES:]
        for key in self._keys:
            try:
                return key.decrypt(nonce, sealed, PURPOSE).decode()
            except InvalidTag:
                continue
        raise SecretUnreadable(
            "a webhook credential was sealed with another key: set VIGIL_SECRET_KEY to that "
            "key (or list it in VIGIL_SECRET_KEY_PREVIOUS), or set the receiver's secret again"
        )


def is_sealed(value: str) -> bool:
    return value.startswith(PREFIX)


def key_file(database_url: str) -> Path | None:
    """Where embedded mode keeps its generated key: next to the SQLite file."""
    url = make_url(database_url)
    if not url.drivername.startswith("sqlite"):
        return None
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    path = Path(database)
    return path.with_name(path.name + ".key")


def _read_or_create(path: Path) -> str:
    """The key in ``path``, created (0600, atomically: two processes agree) if missing."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as out:
            out.write(base64.urlsafe_b64encode(secrets.token_bytes(32)).decode() + "\n")
        log.info("generated the key for webhook secrets in %s", path)
    for _ in range(50):  # another process may be writing it right now
        text = path.read_text().strip()
        if text:
            break
        time.sleep(0.02)
    else:
        raise RuntimeError(f"{path} is empty: delete it or set VIGIL_SECRET_KEY")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning("%s can be read by other users (mode %o): chmod 600 it", path, mode)
    return text


def keyring_for(settings: Settings) -> Keyring:
    """The keyring these settings describe (see the module docstring for the order)."""
    previous = []
    if settings.secret_key_previous is not None:
        raw = settings.secret_key_previous.get_secret_value()
        previous = [p.strip() for p in raw.split(",") if p.strip()]
    if settings.secret_key is not None:
        return Keyring([settings.secret_key.get_secret_value(), *previous], "VIGIL_SECRET_KEY")
    if settings.env == "production" or not settings.embedded:
        log.warning(
            "VIGIL_SECRET_KEY is not set: webhook secrets are sealed with a key derived "
            "from VIGIL_ADMIN_TOKEN (or a key file next to a SQLite database); set "
            "VIGIL_SECRET_KEY, the same on every process, so rotating the admin token "
            "does not make them unreadable"
        )
    path = key_file(settings.database_url)
    if path is not None and path.parent.is_dir():
        return Keyring([_read_or_create(path), *previous], f"key file {path}")
    admin = settings.admin_token.get_secret_value() if settings.admin_token else DEV_ADMIN_TOKEN
    if path is None and settings.is_sqlite:
        log.warning("in-memory database: webhook secrets sealed with the admin token's key")
    return Keyring(["vigil-admin-token\0" + admin, *previous], "derived from the admin token")


_keyring: Keyring | None = None


def configure(settings: Settings) -> Keyring:
    """Set this process's keyring from ``settings``."""
    global _keyring
    _keyring = keyring_for(settings)
    return _keyring


def keyring() -> Keyring:
    """This process's keyring; a worker builds it from the environment on first use."""
    return _keyring if _keyring is not None else configure(get_settings())


def seal(plain: str) -> str:
    return keyring().seal(plain)


def unseal(stored: str) -> str:
    return keyring().unseal(stored)
