"""A service's security state: its options, and the ACLs, credentials and
quotas it follows in etcd.

Every service (broker, coordinator, gateway) builds one `Security` from its
command line (`add_security_arguments`) and installs its interceptor
(tidelog_server.authorizer) on every gRPC server it runs. One PrefixWatcher
follows `<prefix>/security/`, so a change made by `tidelog acls add` (or
users, quotas) reaches every service within one etcd watch round trip.

Until the first listing has arrived, calls that need a decision fail with
COORDINATOR_NOT_AVAILABLE (retriable) rather than being judged against an
empty table. A service without etcd (a standalone broker) has no ACLs, no
credentials and no quotas: anonymous or certificate principals only, with
--allow-everyone-if-no-acl-found deciding for everyone but super users.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import aetcd
from cryptography import x509
from cryptography.x509.oid import NameOID

from tidelog_server.acls import AclBinding, AclTable
from tidelog_server.auth import Authenticator
from tidelog_server.credentials import StoredCredential, Verifier
from tidelog_server.etcd import PrefixWatcher, WatchBatch
from tidelog_server.etcd.keys import Keys
from tidelog_server.quotas import Entity, QuotaManager, decode_quota
from tidelog_server.security_options import SecurityOptions
from tidelog_server.tls import ServerTls

log = logging.getLogger("tidelog.security")

#: How long a start waits for the first listing of the security state.
SYNC_TIMEOUT_S = 5.0


def own_principal(tls: ServerTls | None) -> str | None:
    """ "User:<CN>" of the service's own certificate (its identity when it
    calls other services), or None without TLS."""
    if tls is None:
        return None
    cert = x509.load_pem_x509_certificate(Path(tls.certfile).read_bytes())
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        return None
    value = names[0].value
    return f"User:{value if isinstance(value, str) else value.decode()}"


@dataclass
class Security:
    """The state every call is judged against (see module doc)."""

    options: SecurityOptions
    tls: ServerTls | None
    #: The service applies quotas (brokers; the gateway for its own streams).
    quotas_enabled: bool = False
    acls: AclTable = field(init=False)
    verifier: Verifier = field(init=False, default_factory=Verifier)
    quotas: QuotaManager = field(init=False, default_factory=QuotaManager)
    authenticator: Authenticator = field(init=False)
    synced: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _watcher: PrefixWatcher | None = field(init=False, default=None)
    _task: asyncio.Task[None] | None = field(init=False, default=None)
    _keys: Keys | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        super_users = set(self.options.super_users)
        own = own_principal(self.tls)
        if own is not None:
            super_users.add(own)
        self.acls = AclTable(super_users, self.options.allow_everyone_if_no_acl_found)
        allow_anonymous = self.options.allow_anonymous
        if allow_anonymous is None:
            allow_anonymous = self.tls is None
        self.authenticator = Authenticator(self.verifier, allow_anonymous)

    @property
    def super_users(self) -> frozenset[str]:
        return self.acls.super_users

    async def start(self, client: aetcd.Client | None, keys: Keys | None) -> None:
        """Follow etcd (when there is one); wait a little for the first listing."""
        if client is None or keys is None:
            self.synced.set()
            return
        self._keys = keys
        self._watcher = PrefixWatcher(client, keys.security, self._apply, name="security")
        self._task = asyncio.create_task(self._watcher.run(), name="watch-security")
        try:
            async with asyncio.timeout(SYNC_TIMEOUT_S):
                await self.synced.wait()
        except TimeoutError:
            log.warning("security state not listed from etcd yet: calls wait for it")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _apply(self, batch: WatchBatch) -> None:
        assert self._keys is not None
        keys = self._keys
        if batch.reset:
            acls: dict[bytes, AclBinding] = {}
            users: dict[str, StoredCredential] = {}
            quotas: dict[Entity, dict[str, float]] = {}
            for change in batch.changes:
                if change.value is None:
                    continue
                self._decode_into(keys, change.key, change.value, acls, users, quotas)
            self.acls.replace(acls)
            self.verifier.replace(users)
            self.quotas.replace(quotas)
            self.synced.set()
            return
        for change in batch.changes:
            self._apply_change(keys, change.key, change.value)

    def _decode_into(
        self,
        keys: Keys,
        key: bytes,
        value: bytes,
        acls: dict[bytes, AclBinding],
        users: dict[str, StoredCredential],
        quotas: dict[Entity, dict[str, float]],
    ) -> None:
        try:
            if key.startswith(keys.acls):
                acls[key] = AclBinding.decode(value)
            elif key.startswith(keys.users):
                users[keys.tail(key, keys.users)] = StoredCredential.decode(value)
            elif key.startswith(keys.quotas):
                quotas[_quota_entity(keys, key)] = decode_quota(value)
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("ignoring the unreadable security key %r: %s", key, exc)

    def _apply_change(self, keys: Keys, key: bytes, value: bytes | None) -> None:
        try:
            if key.startswith(keys.acls):
                self.acls.put(key, None if value is None else AclBinding.decode(value))
            elif key.startswith(keys.users):
                user = keys.tail(key, keys.users)
                self.verifier.put(user, None if value is None else StoredCredential.decode(value))
            elif key.startswith(keys.quotas):
                entity = _quota_entity(keys, key)
                self.quotas.put(entity, None if value is None else decode_quota(value))
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("ignoring the unreadable security key %r: %s", key, exc)


def _quota_entity(keys: Keys, key: bytes) -> Entity:
    rest = key[len(keys.quotas) :].decode()
    principal, _, client_id = rest.partition("/")
    return Entity(unquote(principal), unquote(client_id))
