"""The Admin RPCs that manage ACLs, user credentials and quotas, on the coordinator.

Each writes etcd under `<prefix>/security/` (tidelog_server.etcd.keys);
every service follows that prefix (tidelog_server.security), so a change is
in force everywhere one watch round trip later. Who may call these is the
interceptor's business (Alter / Describe on the cluster).

Passwords are hashed here (scrypt with a random salt) and only the hash is
stored; the request carrying the password travels over TLS when the
cluster has it.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import unquote

import aetcd
import grpc
from tidelog.errors import InvalidRequestError
from tidelog.v1 import admin_pb2_grpc, common_pb2, security_pb2
from tidelog_server.acls import MAX_BINDINGS_PER_REQUEST, AclBinding, AclFilter, check_principal
from tidelog_server.credentials import MAX_USERS_PER_REQUEST, StoredCredential, check_user_name
from tidelog_server.etcd.keys import Keys
from tidelog_server.quotas import check_quota_values, decode_quota, encode_quota

from tidelog_coordinator.errors import abort, error_proto


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

    async def _bindings(self) -> list[tuple[bytes, AclBinding]]:
        listing = await self._client.get_prefix(self._keys.acls)
        return [(kv.key, AclBinding.decode(kv.value)) for kv in listing]

    async def CreateAcls(
        self, request: security_pb2.CreateAclsRequest, context: grpc.aio.ServicerContext
    ) -> security_pb2.CreateAclsResponse:
        await self._check_count(len(request.creations), "CreateAcls", context)
        response = security_pb2.CreateAclsResponse()
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
                response.results.append(_invalid(str(exc)))
                continue
            try:
                await self._client.put(self._keys.acl(binding.binding_id), binding.encode())
                response.results.append(common_pb2.Error())
            except Exception as exc:
                response.results.append(error_proto(exc, "storing an ACL"))
        return response

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
        response = security_pb2.DeleteAclsResponse()
        for proto in request.filters:
            wanted = _filter(proto)
            result = response.results.add()
            try:
                for key, binding in bindings:
                    if wanted.matches(binding) and await self._client.delete(key):
                        result.deleted.append(_binding_proto(binding))
            except Exception as exc:
                result.error.CopyFrom(error_proto(exc, "deleting ACLs"))
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
        response = security_pb2.AlterUserCredentialsResponse()
        for upsertion in request.upsertions:
            result = response.results.add(user=upsertion.user)
            try:
                check_user_name(upsertion.user)
                # scrypt: ~50 ms of CPU, off the event loop.
                record = await asyncio.to_thread(StoredCredential.create, upsertion.password)
            except ValueError as exc:
                result.error.CopyFrom(_invalid(str(exc)))
                continue
            try:
                await self._client.put(self._keys.user(upsertion.user), record.encode())
            except Exception as exc:
                result.error.CopyFrom(error_proto(exc, f"storing user {upsertion.user}"))
        for user in request.deletions:
            result = response.results.add(user=user)
            try:
                if not await self._client.delete(self._keys.user(user)):
                    result.error.CopyFrom(_invalid(f"no user {user!r}"))
            except Exception as exc:
                result.error.CopyFrom(error_proto(exc, f"removing user {user}"))
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
        response = security_pb2.AlterClientQuotasResponse()
        for entry in request.entries:
            try:
                principal = check_principal(entry.entity.principal)
                check_quota_values(dict(entry.values))
            except ValueError as exc:
                response.results.append(_invalid(str(exc)))
                continue
            key = self._keys.quota(principal, entry.entity.client_id)
            try:
                # The quotas named replace theirs; the others are kept.
                current = await self._client.get(key)
                values = decode_quota(current.value) if current is not None else {}
                values.update(entry.values)
                values = {k: v for k, v in values.items() if v > 0}
                if values:
                    await self._client.put(key, encode_quota(values))
                else:
                    await self._client.delete(key)
                response.results.append(common_pb2.Error())
            except Exception as exc:
                response.results.append(error_proto(exc, "storing a quota"))
        return response

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
