"""Users, password hashes and role checks.

Passwords are stored as salted scrypt hashes and compared in constant time.
scrypt is deliberately slow (~40 ms), so it runs on a worker thread, and a
successful verification is remembered per (user, password digest) until the
user changes — reconnect storms then cost a hash lookup, not a scrypt each.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from tenantkv import errors

USER_NAME_RE = re.compile(r"^[A-Za-z0-9_.@\-]{1,128}$")
ROLES = ("read", "readwrite")
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
MAX_PASSWORD_BYTES = 1024


@dataclass(slots=True)
class User:
    name: str
    salt: bytes
    hash: bytes
    admin: bool = False
    unthrottled: bool = False
    #: bucket name -> "read" | "readwrite"
    roles: dict[str, str] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        return {
            "salt": self.salt,
            "hash": self.hash,
            "n": SCRYPT_N,
            "admin": self.admin,
            "unthrottled": self.unthrottled,
            "roles": self.roles,
        }

    @classmethod
    def from_record(cls, name: str, rec: dict[str, Any]) -> User:
        return cls(
            name,
            rec["salt"],
            rec["hash"],
            bool(rec.get("admin")),
            bool(rec.get("unthrottled")),
            dict(rec.get("roles") or {}),
        )

    def public(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "admin": self.admin,
            "unthrottled": self.unthrottled,
            "roles": dict(self.roles),
        }

    def can_read(self, bucket: str) -> bool:
        return self.admin or bucket in self.roles

    def can_write(self, bucket: str) -> bool:
        return self.admin or self.roles.get(bucket) == "readwrite"


def hash_password(password: str, salt: bytes) -> bytes:
    return hashlib.scrypt(
        password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32
    )


def new_user(
    name: str,
    password: str,
    *,
    admin: bool = False,
    unthrottled: bool = False,
    roles: dict[str, str] | None = None,
) -> User:
    salt = os.urandom(16)
    return User(name, salt, hash_password(password, salt), admin, unthrottled, dict(roles or {}))


def verify(user: User, password: str) -> bool:
    return hmac.compare_digest(hash_password(password, user.salt), user.hash)


def digest(name: str, password: str) -> bytes:
    """Cache key for a verified credential (never stored on disk)."""
    return hashlib.sha256(name.encode() + b"\0" + password.encode()).digest()


def generate_password() -> str:
    return secrets.token_urlsafe(18)


def validate_user_name(name: Any) -> str:
    if not isinstance(name, str) or not USER_NAME_RE.match(name):
        raise errors.BadValue(
            "user name must be 1-128 characters of letters, digits, '_', '.', '@', '-'"
        )
    return name


def validate_password(password: Any) -> str:
    if not isinstance(password, str) or not password:
        raise errors.BadValue("password must be a non-empty string")
    if len(password.encode()) > MAX_PASSWORD_BYTES:
        raise errors.BadValue(f"password longer than {MAX_PASSWORD_BYTES} bytes")
    return password


def validate_roles(roles: Any) -> dict[str, str]:
    if roles is None:
        return {}
    if not isinstance(roles, dict):
        raise errors.BadValue("roles must be a map of bucket name to 'read' or 'readwrite'")
    for bucket, role in roles.items():
        if role not in ROLES:
            raise errors.BadValue(
                f"role for bucket {bucket!r} must be 'read' or 'readwrite', got {role!r}"
            )
    return dict(roles)
