"""User credentials as stored in etcd: a salted scrypt hash, never the password.

The token a client sends (SASL_SSL in the SDK: a user name and a password in
the call's metadata, over TLS only) is checked against the record written by
`tidelog users add` (Admin AlterUserCredentials). Like Kafka's SCRAM
credentials, the record holds a random salt, the cost parameters and the
derived key; a reader of etcd learns neither the password nor a value that a
client could send instead of it.

scrypt costs ~50 ms and 16 MiB per check on purpose (brute force of a
stolen record), so `Verifier` remembers, per user, a fast digest of the last
password that matched that exact record: later calls with the same password
cost one SHA-256, and a changed or removed record forgets it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
from dataclasses import dataclass

MECHANISM = "scrypt"
SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
KEY_BYTES = 32
SALT_BYTES = 16
#: Limits on what a client controls.
MAX_USER_CHARS = 256
MAX_PASSWORD_BYTES = 1_024
#: Users set by one AlterUserCredentials request (each costs one scrypt).
MAX_USERS_PER_REQUEST = 16
#: scrypt checks of credentials running at once (see Verifier.verify).
SLOW_CHECKS = 1


def check_user_name(user: str) -> str:
    if not user or len(user) > MAX_USER_CHARS or any(c in user for c in ":;,\0\n"):
        raise ValueError(
            f"a user name has 1 to {MAX_USER_CHARS} characters and none of ':;,' "
            f"or control characters, got {user[:40]!r}"
        )
    return user


def _derive(password: bytes, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password, salt=salt, n=n, r=r, p=p, maxmem=64 * 1024 * 1024, dklen=KEY_BYTES
    )


@dataclass(frozen=True, slots=True)
class StoredCredential:
    salt: bytes
    key: bytes
    n: int = SCRYPT_N
    r: int = SCRYPT_R
    p: int = SCRYPT_P

    @property
    def mechanism(self) -> str:
        return f"{MECHANISM}-n{self.n}-r{self.r}-p{self.p}"

    @classmethod
    def create(cls, password: str) -> StoredCredential:
        data = password.encode()
        if not data or len(data) > MAX_PASSWORD_BYTES:
            raise ValueError(f"a password has 1 to {MAX_PASSWORD_BYTES} bytes")
        salt = os.urandom(SALT_BYTES)
        return cls(salt, _derive(data, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P))

    def verify(self, password: bytes) -> bool:
        if len(password) > MAX_PASSWORD_BYTES:
            return False
        derived = _derive(password, self.salt, self.n, self.r, self.p)
        return hmac.compare_digest(derived, self.key)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "mechanism": MECHANISM,
                "n": self.n,
                "r": self.r,
                "p": self.p,
                "salt": self.salt.hex(),
                "key": self.key.hex(),
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> StoredCredential:
        fields = json.loads(data)
        if fields.get("mechanism") != MECHANISM:
            raise ValueError(f"unknown credential mechanism {fields.get('mechanism')!r}")
        return cls(
            bytes.fromhex(fields["salt"]),
            bytes.fromhex(fields["key"]),
            int(fields["n"]),
            int(fields["r"]),
            int(fields["p"]),
        )


class Verifier:
    """Checks (user, password) against the stored records; see module doc.
    One event loop (scrypt runs in threads); not thread-safe."""

    def __init__(self) -> None:
        self._records: dict[str, StoredCredential] = {}
        #: user -> (record it was checked against, SHA-256 of the password).
        self._verified: dict[str, tuple[StoredCredential, bytes]] = {}
        self._slow_checks = asyncio.Semaphore(SLOW_CHECKS)

    def replace(self, records: dict[str, StoredCredential]) -> None:
        self._records = dict(records)
        self._verified.clear()

    def put(self, user: str, record: StoredCredential | None) -> None:
        self._verified.pop(user, None)
        if record is None:
            self._records.pop(user, None)
        else:
            self._records[user] = record

    def users(self) -> list[str]:
        return sorted(self._records)

    async def verify(self, user: str, password: bytes) -> bool:
        record = self._records.get(user)
        if record is None or len(password) > MAX_PASSWORD_BYTES:
            return False
        digest = hashlib.sha256(record.salt + password).digest()
        remembered = self._verified.get(user)
        if remembered is not None and remembered[0] is record:
            return hmac.compare_digest(remembered[1], digest)
        # scrypt takes ~50 ms of CPU: in a thread, so the event loop keeps
        # serving, and at most SLOW_CHECKS at once, so that a flood of wrong
        # passwords costs the service a bounded share of its CPU.
        async with self._slow_checks:
            ok = await asyncio.to_thread(record.verify, password)
        if not ok:
            return False
        if self._records.get(user) is record:
            self._verified[user] = (record, digest)
        return True
