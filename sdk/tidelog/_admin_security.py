"""AdminClient methods for ACLs, user credentials and client quotas.

Kafka's AdminClient names (create_acls, describe_acls, delete_acls,
alter_user_credentials as Kafka's alter_user_scram_credentials,
alter_client_quotas, describe_client_quotas), mixed into AsyncAdminClient
and AdminClient. The servers check every argument and answer with typed
errors; an unauthorized caller gets ClusterAuthorizationFailedError.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from tidelog.errors import TidelogError, error_from_code
from tidelog.v1 import security_pb2

T = TypeVar("T")


@dataclass(frozen=True)
class AclBinding:
    """Allow or deny `principal` (from `host`) `operation` on a resource
    pattern (kafka-acls). resource_type: "topic", "group" or "cluster";
    pattern_type: "literal" or "prefixed"; permission: "allow" or "deny"."""

    principal: str
    operation: str
    resource_type: str
    resource_name: str = ""
    pattern_type: str = "literal"
    permission: str = "allow"
    host: str = "*"

    # The fields are named as the proto's: one copy each way.
    def _proto(self) -> security_pb2.AclBinding:
        return security_pb2.AclBinding(**dataclasses.asdict(self))

    @classmethod
    def _of(cls, proto: security_pb2.AclBinding) -> AclBinding:
        return cls(**{f.name: getattr(proto, f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class AclBindingFilter:
    """Selects bindings; an empty field matches any value. pattern_type
    "match" selects every binding that applies to resource_name."""

    principal: str = ""
    operation: str = ""
    resource_type: str = ""
    resource_name: str = ""
    pattern_type: str = ""
    permission: str = ""
    host: str = ""

    def _proto(self) -> security_pb2.AclBindingFilter:
        return security_pb2.AclBindingFilter(**dataclasses.asdict(self))


@dataclass(frozen=True)
class ClientQuota:
    principal: str
    client_id: str
    #: producer_byte_rate, consumer_byte_rate, request_rate
    values: dict[str, float]


def _raise(error: Any) -> None:
    if error is not None and error.code:
        raise error_from_code(error.code, error.message)


class AsyncSecurityAdmin:
    """Mixed into AsyncAdminClient (which provides _call, _read and
    _timeout_s). Reads (describe_*) go through `_read`, sent again on any
    retriable error; writes through `_call`, sent again only when surely
    not carried out (tidelog._admin_retry)."""

    _timeout_s: float
    _call: Callable[[Callable[[Any], Awaitable[Any]]], Awaitable[Any]]
    _read: Callable[[Callable[[Any], Awaitable[Any]]], Awaitable[Any]]

    async def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        """Add bindings (adding one that exists changes nothing); raises the
        first error after every binding was tried."""
        request = security_pb2.CreateAclsRequest(creations=[b._proto() for b in bindings])
        response = await self._call(lambda s: s.CreateAcls(request, timeout=self._timeout_s))
        for error in response.results:
            _raise(error)

    async def describe_acls(self, acl_filter: AclBindingFilter | None = None) -> list[AclBinding]:
        request = security_pb2.DescribeAclsRequest(
            filter=(acl_filter or AclBindingFilter())._proto()
        )
        response = await self._read(lambda s: s.DescribeAcls(request, timeout=self._timeout_s))
        if response.HasField("error"):
            _raise(response.error)
        return [AclBinding._of(b) for b in response.acls]

    async def delete_acls(self, filters: Iterable[AclBindingFilter]) -> list[AclBinding]:
        """Remove every binding matching any filter; the removed bindings."""
        request = security_pb2.DeleteAclsRequest(filters=[f._proto() for f in filters])
        response = await self._call(lambda s: s.DeleteAcls(request, timeout=self._timeout_s))
        deleted: list[AclBinding] = []
        for result in response.results:
            if result.HasField("error"):
                _raise(result.error)
            deleted.extend(AclBinding._of(b) for b in result.deleted)
        return deleted

    async def alter_user_credentials(
        self, upsertions: Mapping[str, str] | None = None, deletions: Iterable[str] = ()
    ) -> dict[str, TidelogError | None]:
        """Set passwords (user -> password; stored as salted hashes) and
        remove users: user -> None or its typed error."""
        request = security_pb2.AlterUserCredentialsRequest(
            upsertions=[
                security_pb2.UserCredentialUpsert(user=u, password=p)
                for u, p in (upsertions or {}).items()
            ],
            deletions=list(deletions),
        )
        response = await self._call(
            lambda s: s.AlterUserCredentials(request, timeout=self._timeout_s)
        )
        return {
            r.user: (error_from_code(r.error.code, r.error.message) if r.error.code else None)
            for r in response.results
        }

    async def describe_user_credentials(self, users: Iterable[str] = ()) -> dict[str, str]:
        """user -> mechanism (never the hash), for the named users or all."""
        request = security_pb2.DescribeUserCredentialsRequest(users=list(users))
        response = await self._read(
            lambda s: s.DescribeUserCredentials(request, timeout=self._timeout_s)
        )
        for user in response.users:
            if user.HasField("error"):
                _raise(user.error)
        return {u.user: u.mechanism for u in response.users}

    async def alter_client_quotas(
        self, principal: str, values: Mapping[str, float], client_id: str = ""
    ) -> None:
        """Replace the quotas of (principal, client id); a value <= 0 (or
        none at all) removes them. Principal "User:<default>": the default."""
        entry = security_pb2.ClientQuota(values=dict(values))
        entry.entity.principal = principal
        entry.entity.client_id = client_id
        request = security_pb2.AlterClientQuotasRequest(entries=[entry])
        response = await self._call(lambda s: s.AlterClientQuotas(request, timeout=self._timeout_s))
        for error in response.results:
            _raise(error)

    async def describe_client_quotas(self, principal: str = "") -> list[ClientQuota]:
        request = security_pb2.DescribeClientQuotasRequest(principal=principal)
        response = await self._read(
            lambda s: s.DescribeClientQuotas(request, timeout=self._timeout_s)
        )
        return [
            ClientQuota(e.entity.principal, e.entity.client_id, dict(e.values))
            for e in response.entries
        ]


class SecurityAdmin:
    """Mixed into AdminClient: the blocking forms of AsyncSecurityAdmin's methods."""

    _async: Any
    _loop_thread: Any
    _timeout_s: float

    def _run(self, coro: Awaitable[T]) -> T:
        result: T = self._loop_thread.run(coro, self._timeout_s)
        return result

    def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        self._run(self._async.create_acls(list(bindings)))

    def describe_acls(self, acl_filter: AclBindingFilter | None = None) -> list[AclBinding]:
        return self._run(self._async.describe_acls(acl_filter))

    def delete_acls(self, filters: Iterable[AclBindingFilter]) -> list[AclBinding]:
        return self._run(self._async.delete_acls(list(filters)))

    def alter_user_credentials(
        self, upsertions: Mapping[str, str] | None = None, deletions: Iterable[str] = ()
    ) -> dict[str, TidelogError | None]:
        return self._run(self._async.alter_user_credentials(upsertions, list(deletions)))

    def describe_user_credentials(self, users: Iterable[str] = ()) -> dict[str, str]:
        return self._run(self._async.describe_user_credentials(list(users)))

    def alter_client_quotas(
        self, principal: str, values: Mapping[str, float], client_id: str = ""
    ) -> None:
        self._run(self._async.alter_client_quotas(principal, values, client_id))

    def describe_client_quotas(self, principal: str = "") -> list[ClientQuota]:
        return self._run(self._async.describe_client_quotas(principal))
