"""The Admin RPCs that manage ACLs, user credentials and quotas, on the coordinator.

Each writes etcd under `<prefix>/security/` (tidelog_server.etcd.keys);
every service follows that prefix (tidelog_server.security), so a change is
in force everywhere one watch round trip later. Who may call these is the
interceptor's business (Alter / Describe on the cluster).

Passwords are hashed here (scrypt with a random salt) and only the hash is
stored; the request carrying the password travels over TLS when the
cluster has it.

What one request costs in etcd round trips does not grow with its entries:
its writes go in transactions of up to etcd's --max-txn-ops operations
(`_write` for DeleteAcls; security_writes for CreateAcls,
AlterClientQuotas and AlterUserCredentials, which read the stored bindings,
quotas or users with one range read). The same binding, user
or quota entity given twice in one request is refused in each of its entries
with INVALID_REQUEST, as Kafka refuses a user named twice in
AlterUserScramCredentials: there is no order between two entries of one
request to honour, and one transaction cannot write a key twice.

Concurrent requests: AlterClientQuotas merges the values given into the
stored ones, and CreateAcls counts the stored bindings against
--max-acl-bindings (AlterClientQuotas the entities against
--max-quota-entities), so both write through security_writes, whose
transactions compare what they read. DeleteAcls deletes the keys it read
(a binding's key names its content, so a key read is the binding matched; a
binding created after the read is not deleted, as if created after the
DeleteAcls). AlterUserCredentials counts the stored users against
--max-users through security_writes too (the passwords hashed first, off
the event loop; its removals written before its additions, so that at the
cap a request removing one user and adding another passes); each user's
record is written whole, so of two concurrent requests setting one user's
password the last wins, as in Kafka.

DeleteAcls matches its filters against indexes of the bindings it read, its
work bounded per request (acl_deletions).
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable
from typing import Any
from urllib.parse import unquote

import aetcd
import grpc
from tidelog.errors import InvalidRequestError
from tidelog.request_limits import repeated
from tidelog.v1 import admin_pb2_grpc, common_pb2, security_pb2
from tidelog_server.acls import (
    MAX_BINDINGS_PER_REQUEST,
    AclBinding,
    AclFilter,
    check_principal,
    describe,
)
from tidelog_server.credentials import MAX_USERS_PER_REQUEST, StoredCredential, check_user_name
from tidelog_server.etcd.keys import Keys
from tidelog_server.quotas import (
    check_quota_client_id,
    check_quota_values,
    decode_quota,
    encode_quota,
)

from tidelog_coordinator.acl_deletions import claim
from tidelog_coordinator.errors import abort, error_proto
from tidelog_coordinator.security_writes import Change, Entry, GuardedWriter, KeyCap


def _binding_proto(binding: AclBinding) -> security_pb2.AclBinding:
    return security_pb2.AclBinding(
        resource_type=binding.resource_type,
        resource_name=binding.resource_name,
        pattern_type=binding.pattern_type,
        principal=binding.principal,
        host=binding.host,
        operation=binding.operation,
        permission=binding.permission,
    )


def _filter(proto: security_pb2.AclBindingFilter) -> AclFilter:
    return AclFilter(
        proto.resource_type,
        proto.resource_name,
        proto.pattern_type,
        proto.principal,
        proto.host,
        proto.operation,
        proto.permission,
    )


def _invalid(message: str) -> common_pb2.Error:
    return error_proto(InvalidRequestError(message), "checking the request")


def _given_twice(what: str, rpc: str) -> common_pb2.Error:
    return _invalid(f"{what} is given more than once in one {rpc} request: give it once")


def _twice(items: Iterable[Hashable | None]) -> set[Hashable]:
    """The items given more than once (None: an entry refused already)."""
    return repeated(item for item in items if item is not None)


def _stored_as(value: bytes) -> Change:
    """A key's change to `value` (nothing to write when stored already)."""
    return lambda _stored: value


def _merged_quota(given: dict[str, float]) -> Change:
    """A quota entity's change: the quotas given replace theirs, the others
    are kept, and one of 0 or less is removed (no quota left: no key)."""

    def change(stored: bytes | None) -> bytes | None:
        values = decode_quota(stored) if stored is not None else {}
        values.update(given)
        values = {k: v for k, v in values.items() if v > 0}
        return encode_quota(values) if values else None

    return change


def _removed_user(user: str) -> Change:
    """A user's removal: refused when no such user is stored."""

    def change(stored: bytes | None) -> bytes | None:
        if stored is None:
            raise InvalidRequestError(f"no user {user[:64]!r}")
        return None

    return change


#: (index of the entry in the request, an etcd transaction operation)
_Write = tuple[int, Any]


_ALTER_USERS = "AlterUserCredentials"


class SecurityAdmin(admin_pb2_grpc.AdminServicer):
    """Mixed into the coordinator's AdminServicer, which sets `metadata`
    (its etcd client and keys)."""

    metadata: Any

    @property
    def _client(self) -> aetcd.Client:
        client: aetcd.Client = self.metadata.client
        return client

    @property
    def _keys(self) -> Keys:
        keys: Keys = self.metadata.keys
        return keys

    @staticmethod
    async def _check_count(count: int, rpc: str, context: grpc.aio.ServicerContext) -> None:
        if count > MAX_BINDINGS_PER_REQUEST:
            await abort(
                context,
                InvalidRequestError(
                    f"{rpc} names {count} entries: at most {MAX_BINDINGS_PER_REQUEST} "
                    "(MAX_BINDINGS_PER_REQUEST)"
                ),
                f"answering {rpc}",
            )

    def _guarded_writer(self, prefix: bytes, cap: KeyCap, what: str) -> GuardedWriter:
        return GuardedWriter(self._client, prefix, cap, self.metadata.config.etcd_max_txn_ops, what)

    async def _bindings(self) -> list[tuple[bytes, AclBinding]]:
        listing = await self._client.get_prefix(self._keys.acls)
        return [(kv.key, AclBinding.decode(kv.value)) for kv in listing]

    async def _write(self, writes: list[_Write]) -> list[tuple[int, Any]]:
        """Carry out `writes` in transactions of at most etcd's --max-txn-ops
        operations: for each, its entry's index and the operation's answer
        (a ResponseOp), or the exception that failed its transaction."""
        chunk = max(1, self.metadata.config.etcd_max_txn_ops)
        answers: list[tuple[int, Any]] = []
        for start in range(0, len(writes), chunk):
            part = writes[start : start + chunk]
            try:
                _, responses = await self._client.transaction(
                    compare=[], success=[op for _, op in part], failure=[]
                )
            except Exception as exc:
                answers.extend((index, exc) for index, _ in part)
                continue
            indexes = [index for index, _ in part]
            answers.extend(zip(indexes, responses, strict=True))
        return answers

    async def CreateAcls(
        self, request: security_pb2.CreateAclsRequest, context: grpc.aio.ServicerContext
    ) -> security_pb2.CreateAclsResponse:
        await self._check_count(len(request.creations), "CreateAcls", context)
        results: list[common_pb2.Error] = []
        bindings: list[AclBinding | None] = []
        for creation in request.creations:
            try:
                binding = AclBinding.checked(
                    creation.resource_type,
                    creation.resource_name,
                    creation.pattern_type,
                    creation.principal,
                    creation.host,
                    creation.operation,
                    creation.permission,
                )
            except ValueError as exc:
                results.append(_invalid(str(exc)))
                bindings.append(None)
                continue
            results.append(common_pb2.Error())
            bindings.append(binding)
        twice = _twice(bindings)
        entries: list[Entry] = []
        for index, checked in enumerate(bindings):
            if checked is None:
                continue
            if checked in twice:
                results[index] = _given_twice(f"the ACL {describe(checked)}", "CreateAcls")
            else:
                key = self._keys.acl(checked.binding_id)
                entries.append(Entry(index, key, _stored_as(checked.encode())))
        cap = KeyCap(self.metadata.config.max_acl_bindings, "ACL bindings", "--max-acl-bindings")
        writer = self._guarded_writer(self._keys.acls, cap, "storing an ACL")
        for index, error in (await writer.write(entries)).items():
            results[index] = error
        return security_pb2.CreateAclsResponse(results=results)

    async def DescribeAcls(
        self, request: security_pb2.DescribeAclsRequest, context: grpc.aio.ServicerContext
    ) -> security_pb2.DescribeAclsResponse:
        try:
            bindings = await self._bindings()
        except Exception as exc:
            await abort(context, exc, "listing ACLs")
        wanted = _filter(request.filter)
        return security_pb2.DescribeAclsResponse(
            acls=[_binding_proto(b) for _, b in bindings if wanted.matches(b)]
        )

    async def DeleteAcls(
        self, request: security_pb2.DeleteAclsRequest, context: grpc.aio.ServicerContext
    ) -> security_pb2.DeleteAclsResponse:
        await self._check_count(len(request.filters), "DeleteAcls", context)
        try:
            bindings = await self._bindings()
        except Exception as exc:
            await abort(context, exc, "listing ACLs")
        claims = claim(bindings, [_filter(proto) for proto in request.filters])
        claimed = claims.claimed
        tx = self._client.transactions
        by_key = dict(bindings)
        writes = [(index, tx.delete(key)) for key, index in claimed.items()]
        response = security_pb2.DeleteAclsResponse()
        for _ in request.filters:
            response.results.add()
        for index, refusal in claims.refused.items():
            response.results[index].error.CopyFrom(error_proto(refusal, "matching ACLs"))
        answers = await self._write(writes)
        for key, (index, answer) in zip(claimed, answers, strict=True):
            result = response.results[index]
            if isinstance(answer, BaseException):
                result.error.CopyFrom(error_proto(answer, "deleting ACLs"))
            elif answer.response_delete_range.deleted:
                # (Deleted meanwhile by another request: not reported twice.)
                result.deleted.append(_binding_proto(by_key[key]))
        return response

    async def AlterUserCredentials(
        self, request: security_pb2.AlterUserCredentialsRequest, context: grpc.aio.ServicerContext
    ) -> security_pb2.AlterUserCredentialsResponse:
        await self._check_count(len(request.deletions), "AlterUserCredentials", context)
        if len(request.upsertions) > MAX_USERS_PER_REQUEST:
            await abort(
                context,
                InvalidRequestError(
                    f"AlterUserCredentials sets {len(request.upsertions)} passwords: at most "
                    f"{MAX_USERS_PER_REQUEST} (MAX_USERS_PER_REQUEST; each is hashed with scrypt)"
                ),
                "answering AlterUserCredentials",
            )
        users = [u.user for u in request.upsertions] + list(request.deletions)
        twice = _twice(users)
        response = security_pb2.AlterUserCredentialsResponse()
        # Removals first: at --max-users, a request that removes one user
        # and adds another makes room for it.
        removals: list[Entry] = []
        entries: list[Entry] = []
        for index, upsertion in enumerate(request.upsertions):
            result = response.results.add(user=upsertion.user)
            if upsertion.user in twice:
                result.error.CopyFrom(_given_twice(f"user {upsertion.user[:64]!r}", _ALTER_USERS))
                continue
            try:
                check_user_name(upsertion.user)
                # scrypt: ~50 ms of CPU, off the event loop.
                record = await asyncio.to_thread(StoredCredential.create, upsertion.password)
            except ValueError as exc:
                result.error.CopyFrom(_invalid(str(exc)))
                continue
            key = self._keys.user(upsertion.user)
            entries.append(Entry(index, key, _stored_as(record.encode())))
        for index, user in enumerate(request.deletions, start=len(request.upsertions)):
            result = response.results.add(user=user)
            if user in twice:
                result.error.CopyFrom(_given_twice(f"user {user[:64]!r}", _ALTER_USERS))
                continue
            removals.append(Entry(index, self._keys.user(user), _removed_user(user)))
        cap = KeyCap(self.metadata.config.max_users, "users", "--max-users")
        writer = self._guarded_writer(self._keys.users, cap, "storing a user")
        for index, error in (await writer.write(removals + entries)).items():
            response.results[index].error.CopyFrom(error)
        return response

    async def DescribeUserCredentials(
        self,
        request: security_pb2.DescribeUserCredentialsRequest,
        context: grpc.aio.ServicerContext,
    ) -> security_pb2.DescribeUserCredentialsResponse:
        await self._check_count(len(request.users), "DescribeUserCredentials", context)
        try:
            listing = await self._client.get_prefix(self._keys.users)
        except Exception as exc:
            await abort(context, exc, "listing users")
        known = {}
        for kv in listing:
            user = self._keys.tail(kv.key, self._keys.users)
            try:
                known[user] = StoredCredential.decode(kv.value).mechanism
            except (ValueError, KeyError):
                known[user] = "unreadable"
        response = security_pb2.DescribeUserCredentialsResponse()
        for user in request.users or sorted(known):
            if user in known:
                response.users.add(user=user, mechanism=known[user])
            else:
                response.users.add(user=user, error=_invalid(f"no user {user!r}"))
        return response

    async def AlterClientQuotas(
        self, request: security_pb2.AlterClientQuotasRequest, context: grpc.aio.ServicerContext
    ) -> security_pb2.AlterClientQuotasResponse:
        await self._check_count(len(request.entries), "AlterClientQuotas", context)
        results: list[common_pb2.Error] = []
        keys: list[bytes | None] = []
        for entry in request.entries:
            try:
                principal = check_principal(entry.entity.principal)
                client_id = check_quota_client_id(entry.entity.client_id)
                check_quota_values(dict(entry.values))
            except ValueError as exc:
                results.append(_invalid(str(exc)))
                keys.append(None)
                continue
            results.append(common_pb2.Error())
            keys.append(self._keys.quota(principal, client_id))
        twice = _twice(keys)
        entries: list[Entry] = []
        for index, (entry, key) in enumerate(zip(request.entries, keys, strict=True)):
            if key is None:
                continue
            if key in twice:
                entity = f"{entry.entity.principal[:64]} client id {entry.entity.client_id[:64]!r}"
                results[index] = _given_twice(f"the quota entity {entity}", "AlterClientQuotas")
                continue
            entries.append(Entry(index, key, _merged_quota(dict(entry.values))))
        cap = KeyCap(
            self.metadata.config.max_quota_entities, "quota entities", "--max-quota-entities"
        )
        writer = self._guarded_writer(self._keys.quotas, cap, "storing a quota")
        for index, error in (await writer.write(entries)).items():
            results[index] = error
        return security_pb2.AlterClientQuotasResponse(results=results)

    async def DescribeClientQuotas(
        self, request: security_pb2.DescribeClientQuotasRequest, context: grpc.aio.ServicerContext
    ) -> security_pb2.DescribeClientQuotasResponse:
        try:
            listing = await self._client.get_prefix(self._keys.quotas)
        except Exception as exc:
            await abort(context, exc, "listing quotas")
        response = security_pb2.DescribeClientQuotasResponse()
        for kv in listing:
            principal, _, client_id = kv.key[len(self._keys.quotas) :].decode().partition("/")
            principal, client_id = unquote(principal), unquote(client_id)
            if request.principal and request.principal != principal:
                continue
            entry = response.entries.add()
            entry.entity.principal = principal
            entry.entity.client_id = client_id
            entry.values.update(decode_quota(kv.value))
        return response
