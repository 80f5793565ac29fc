"""The gRPC server interceptor that authenticates, authorizes and throttles
every call of a service.

`RULES` maps each RPC to the (operation, resource) pairs its request asks
for, as Kafka maps its requests: Produce = Write topic, Fetch = Read topic,
CreateTopics = Create on the cluster or on the topic, group calls = Read
group, admin of ACLs = Alter cluster, ... Stream RPCs are checked message by
message (a produce stream may name a new topic at any time). Listings that
name nothing (DescribeTopics, Metadata, ListGroups with no names) are
filtered to what the principal may Describe, as Kafka's metadata is.

Metadata with allow_auto_topic_creation creates only the topics the caller
may Create (on the topic, or on the cluster), as Kafka's does: the
interceptor hands the servicer `may_auto_create` for the call (a context
variable, set in the task that runs the servicer), and a topic the caller may
Describe but not Create stays unknown (UNKNOWN_TOPIC_OR_PARTITION).

A denied call ends with PERMISSION_DENIED and TOPIC_/GROUP_/
CLUSTER_AUTHORIZATION_FAILED naming the principal, the operation and the
resource; an unauthenticated one with UNAUTHENTICATED and
SASL_AUTHENTICATION_FAILED. Health checks and reflection need no identity
(probes and tools).

Quotas (tidelog_server.quotas) are applied here too, on the services that
enable them: the bytes of Produce requests and of Fetch answers (and of
their Records counterparts on the gateway), and every request, are counted
per (principal, client id); over a quota, answers carry
`throttle_time_ms` and the stream's next read (or next answer) waits that
long. Super users (the cluster's own identities) are not throttled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import grpc
from tidelog.errors import (
    ERROR_CODE_METADATA_KEY,
    AuthorizationFailedError,
    ClusterAuthorizationFailedError,
    CoordinatorNotAvailableError,
    GroupAuthorizationFailedError,
    InvalidRequestError,
    SaslAuthenticationError,
    TidelogError,
    TopicAuthorizationFailedError,
)

from tidelog_server.acls import CLUSTER_NAME
from tidelog_server.auth import Caller
from tidelog_server.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_RATE,
    THROTTLE_TIME_METADATA_KEY,
)
from tidelog_server.security import Security
from tidelog_server.stream_refusal import StreamLimitError, refuse_stream_with

log = logging.getLogger("tidelog.authorizer")

#: (operation, resource type, resource name)
Check = tuple[str, str, str]

_OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _topics(names: Iterable[str], operation: str) -> list[Check]:
    return [(operation, "topic", name) for name in dict.fromkeys(names)]


def _group(group_id: str, operation: str) -> list[Check]:
    return [(operation, "group", group_id)] if group_id else []


def _cluster(operation: str) -> list[Check]:
    return [(operation, "cluster", CLUSTER_NAME)]


@dataclass(frozen=True)
class Rule:
    """What one RPC asks for. `checks(request, stream_state)`; `listing`
    names the response field filtered by Describe (topic or group) when the
    request names nothing; `quota` is "produce" or "fetch" for the streams
    whose bytes count against the byte-rate quotas."""

    checks: Callable[[Any, dict[str, str]], list[Check]]
    listing: tuple[str, str, str] | None = None  # (response field, resource type, name field)
    quota: str = ""
    #: `checks` keeps state across a stream's requests (`_consume`: the
    #: group named once): it runs on every request even when no check can
    #: be refused, so that the state is right once ACLs appear.
    stateful: bool = False


def _consume(request: Any, state: dict[str, str]) -> list[Check]:
    checks = _topics((p.topic for p in request.positions), "Read")
    if request.HasField("group"):
        state["group"] = request.group.group_id
        checks += _group(request.group.group_id, "Read")
        checks += _topics(request.group.topics, "Read")
    if request.HasField("commit"):
        checks += _group(state.get("group", ""), "Read")
        checks += _topics((o.topic for o in request.commit.offsets), "Read")
    return checks


def _commit(request: Any) -> list[Check]:
    """A member's commit (CommitOffsets, and each request of a commit stream)."""
    return _group(request.group_id, "Read") + _topics((o.topic for o in request.offsets), "Read")


def _create_topics(request: Any, state: dict[str, str]) -> list[Check]:
    # Create on the cluster covers every topic; see Interceptor._denied.
    return _topics((t.name for t in request.topics), "Create")


_NONE: Callable[[Any, dict[str, str]], list[Check]] = lambda r, s: []  # noqa: E731

RULES: dict[str, Rule] = {
    # Log (broker, gateway)
    "/tidelog.v1.Log/Produce": Rule(
        lambda r, s: _topics((p.topic for p in r.partitions), "Write"), quota="produce"
    ),
    "/tidelog.v1.Log/Fetch": Rule(
        lambda r, s: _topics((p.topic for p in r.positions), "Read"), quota="fetch"
    ),
    "/tidelog.v1.Log/ListOffsets": Rule(
        lambda r, s: _topics((p.topic for p in r.partitions), "Describe")
    ),
    "/tidelog.v1.Log/Metadata": Rule(
        lambda r, s: _topics(r.topics, "Describe"), listing=("topics", "topic", "name")
    ),
    # Records (gateway): quotas as on Log, answers with throttle_time_ms (the
    # gateway calls the brokers as itself, a super user, so only it can).
    "/tidelog.v1.Records/Produce": Rule(
        lambda r, s: _topics((x.topic for x in r.records), "Write"), quota="produce"
    ),
    "/tidelog.v1.Records/Consume": Rule(_consume, quota="fetch", stateful=True),
    # Admin (coordinator; forwarded by brokers and the gateway)
    "/tidelog.v1.Admin/CreateTopics": Rule(_create_topics),
    "/tidelog.v1.Admin/DeleteTopics": Rule(lambda r, s: _topics(r.names, "Delete")),
    "/tidelog.v1.Admin/DescribeTopics": Rule(
        lambda r, s: _topics(r.names, "Describe"), listing=("topics", "topic", "name")
    ),
    "/tidelog.v1.Admin/DescribeConfigs": Rule(lambda r, s: _topics(r.names, "DescribeConfigs")),
    "/tidelog.v1.Admin/AlterConfigs": Rule(
        lambda r, s: _topics((t.name for t in r.topics), "AlterConfigs")
    ),
    "/tidelog.v1.Admin/CreatePartitions": Rule(
        lambda r, s: _topics((t.name for t in r.topics), "Alter")
    ),
    "/tidelog.v1.Admin/DeleteRecords": Rule(
        lambda r, s: _topics((p.topic for p in r.partitions), "Delete")
    ),
    "/tidelog.v1.Admin/ElectLeaders": Rule(lambda r, s: _cluster("Alter")),
    "/tidelog.v1.Admin/AlterPartitionReassignments": Rule(lambda r, s: _cluster("Alter")),
    "/tidelog.v1.Admin/ListPartitionReassignments": Rule(lambda r, s: _cluster("Describe")),
    "/tidelog.v1.Admin/CreateAcls": Rule(lambda r, s: _cluster("Alter")),
    "/tidelog.v1.Admin/DeleteAcls": Rule(lambda r, s: _cluster("Alter")),
    "/tidelog.v1.Admin/DescribeAcls": Rule(lambda r, s: _cluster("Describe")),
    "/tidelog.v1.Admin/AlterUserCredentials": Rule(lambda r, s: _cluster("Alter")),
    "/tidelog.v1.Admin/DescribeUserCredentials": Rule(lambda r, s: _cluster("Describe")),
    "/tidelog.v1.Admin/AlterClientQuotas": Rule(lambda r, s: _cluster("AlterConfigs")),
    "/tidelog.v1.Admin/DescribeClientQuotas": Rule(lambda r, s: _cluster("DescribeConfigs")),
    # Cluster: every authenticated principal may find the servers and get a
    # producer id (its writes are checked topic by topic).
    "/tidelog.v1.Cluster/DescribeCluster": Rule(_NONE),
    "/tidelog.v1.Cluster/InitProducerId": Rule(_NONE),
    # Group (coordinator, gateway)
    "/tidelog.v1.Group/Heartbeat": Rule(lambda r, s: _group(r.group_id, "Read")),
    "/tidelog.v1.Group/LeaveGroup": Rule(lambda r, s: _group(r.group_id, "Read")),
    "/tidelog.v1.Group/CommitOffsets": Rule(lambda r, s: _commit(r)),
    "/tidelog.v1.Group/CommitOffsetsStream": Rule(
        lambda r, s: [check for c in r.commits for check in _commit(c.commit)]
    ),
    "/tidelog.v1.Group/AlterOffsets": Rule(
        lambda r, s: _group(r.group_id, "Read") + _topics((o.topic for o in r.offsets), "Read")
    ),
    "/tidelog.v1.Group/FetchOffsets": Rule(
        lambda r, s: (
            _group(r.group_id, "Describe") + _topics((p.topic for p in r.partitions), "Describe")
        )
    ),
    "/tidelog.v1.Group/ListGroups": Rule(_NONE, listing=("groups", "group", "group_id")),
    "/tidelog.v1.Group/DescribeGroup": Rule(lambda r, s: _group(r.group_id, "Describe")),
    "/tidelog.v1.Group/DeleteGroup": Rule(lambda r, s: _group(r.group_id, "Delete")),
    # Internal listener: replication is the cluster's own business.
    "/tidelog.internal.Replica/ReplicaFetch": Rule(lambda r, s: _cluster("ClusterAction")),
}
#: An RPC missing from RULES (added later, and forgotten here) needs Alter on
#: the cluster: closed by default, open to administrators.
DEFAULT_RULE = Rule(lambda r, s: _cluster("Alter"))

#: Which topics the caller of the call being served may create (set by the
#: interceptor around a unary call; unset: no interceptor, no ACLs).
_MAY_CREATE: ContextVar[Callable[[str], bool] | None] = ContextVar(
    "tidelog_may_create", default=None
)


def may_auto_create(topic: str) -> bool:
    """Whether the caller of the call being served may create `topic` (what
    Metadata's auto-creation asks before creating it). True outside an
    authorized call (a service without the interceptor has no ACLs)."""
    check = _MAY_CREATE.get()
    return check is None or check(topic)


_ERRORS: dict[str, type[AuthorizationFailedError]] = {
    "topic": TopicAuthorizationFailedError,
    "group": GroupAuthorizationFailedError,
    "cluster": ClusterAuthorizationFailedError,
}


class Interceptor(grpc.aio.ServerInterceptor):
    """See the module doc. One per service process."""

    def __init__(self, security: Security) -> None:
        self.security = security
        #: Streams open per principal (super users not counted).
        self._streams: Counter[str] = Counter()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        # The handler's behaviours are the servicers' coroutines and async
        # generators; grpc's stubs type them as synchronous ones.
        handler: Any = await continuation(details)
        method: str = details.method
        if handler is None or method.startswith(_OPEN_SERVICES):
            return handler
        rule = RULES.get(method, DEFAULT_RULE)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, rule),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._stream(handler.stream_stream, rule),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            behavior = handler.unary_stream

            async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                caller = await self._admit(context)
                await self._check(self._refused(caller, rule, request, {}), context)
                async for response in behavior(request, context):
                    yield response

            return grpc.unary_stream_rpc_method_handler(
                unary_stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        # Client streams: none in the API; refuse rather than pass unchecked.
        raise AssertionError(f"{method}: client-streaming RPCs have no authorization rule")

    # Decisions

    async def _admit(self, context: grpc.aio.ServicerContext) -> Caller:
        """The caller, once the security state is known; aborts otherwise."""
        try:
            return await self._caller(context)
        except (CoordinatorNotAvailableError, SaslAuthenticationError) as exc:
            await _abort(context, exc)
            raise  # pragma: no cover

    async def _caller(self, context: grpc.aio.ServicerContext) -> Caller:
        """The caller; raises CoordinatorNotAvailableError while the security
        state is not known, SaslAuthenticationError for a bad identity."""
        if not self.security.synced.is_set():
            raise CoordinatorNotAvailableError(
                "this service has not loaded the ACLs from etcd yet: retry"
            )
        return await self.security.authenticator.caller(context)

    def _denied(self, caller: Caller, checks: list[Check]) -> AuthorizationFailedError | None:
        acls = self.security.acls
        for operation, resource_type, name in checks:
            decision = acls.authorize(caller.principal, caller.host, operation, resource_type, name)
            if decision.allowed:
                continue
            if operation == "Create" and resource_type == "topic":
                # Kafka: Create on the cluster allows creating any topic.
                on_cluster = acls.authorize(
                    caller.principal, caller.host, "Create", "cluster", CLUSTER_NAME
                )
                if on_cluster.allowed:
                    continue
            return _ERRORS[resource_type](
                f"{caller.principal} (from {caller.host}) is not authorized to {operation} "
                f"{resource_type} {name!r}: {decision.reason}"
            )
        return None

    def _refused(
        self, caller: Caller, rule: Rule, request: Any, state: dict[str, str]
    ) -> AuthorizationFailedError | None:
        """What `_denied` says of the checks of `request`. Without ACLs (or
        for a super user) every check is allowed: the checks are then not
        listed at all (a list per request and a decision per topic: 2-7% of
        a coordinator's CPU under offset commits, py-spy), unless the rule
        keeps state across a stream's requests."""
        if self.security.acls.allows_everything(caller.principal):
            if rule.stateful:
                rule.checks(request, state)
            return None
        return self._denied(caller, rule.checks(request, state))

    def _may_create(self, caller: Caller, topic: str) -> bool:
        """Create on the topic, or on the cluster (which covers every topic)."""
        return self._denied(caller, [("Create", "topic", topic)]) is None

    async def _check(
        self, denied: AuthorizationFailedError | None, context: grpc.aio.ServicerContext
    ) -> None:
        """End the call with `denied`, if any."""
        if denied is not None:
            log.info("denied: %s", denied.message)
            await _abort(context, denied)

    def _allowed_to_describe(self, caller: Caller, resource_type: str, name: str) -> bool:
        decision = self.security.acls.authorize(
            caller.principal, caller.host, "Describe", resource_type, name
        )
        return decision.allowed

    def _metered(self, caller: Caller) -> bool:
        """Whether this caller's traffic counts against quotas right now (a
        quota set while a stream is open applies to it from then on)."""
        security = self.security
        return (
            security.quotas_enabled
            and security.quotas.enabled
            and caller.principal not in security.super_users
        )

    def _throttle_ms(self, caller: Caller, key: str, amount: float) -> int:
        return self.security.quotas.record(caller.principal, caller.client_id, key, amount)

    def _open_stream(self, caller: Caller) -> bool:
        """Count one more stream of `caller`; raise StreamLimitError naming
        the limit when it already has --max-streams-per-principal open. True
        when counted."""
        if caller.principal in self.security.super_users:
            return False
        limit = self.security.options.max_streams_per_principal
        open_now = self._streams[caller.principal]
        if open_now >= limit:
            raise StreamLimitError(
                f"{caller.principal} already has {open_now} streams open on this service, "
                f"its limit (--max-streams-per-principal={limit}): one stream carries "
                "every partition"
            )
        self._streams[caller.principal] += 1
        return True

    def _close_stream(self, caller: Caller) -> None:
        self._streams[caller.principal] -= 1
        if self._streams[caller.principal] <= 0:
            del self._streams[caller.principal]

    # Wrappers

    def _unary(self, behavior: Callable[..., Awaitable[Any]], rule: Rule) -> Callable[..., Any]:
        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            caller = await self._admit(context)
            await self._check(self._refused(caller, rule, request, {}), context)
            if self._metered(caller):
                throttle_ms = self._throttle_ms(caller, REQUEST_RATE, 1)
                if throttle_ms:
                    # Request quota: the answer is held back, never refused,
                    # and says by how much (Kafka's throttle time).
                    context.set_trailing_metadata(((THROTTLE_TIME_METADATA_KEY, str(throttle_ms)),))
                    await asyncio.sleep(throttle_ms / 1000)
            # Same task as the servicer: it sees this (Metadata's auto-creation).
            _MAY_CREATE.set(
                lambda topic: self._denied(caller, [("Create", "topic", topic)]) is None
            )
            response = await behavior(request, context)
            listing = rule.listing
            if listing is not None and response is not None and not _named(request, rule):
                field_name, resource_type, name_field = listing
                items = getattr(response, field_name)
                kept = [
                    item
                    for item in items
                    if self._allowed_to_describe(caller, resource_type, getattr(item, name_field))
                ]
                if len(kept) != len(items):
                    del items[:]
                    items.extend(kept)
            return response

        return unary

    def _stream(
        self, behavior: Callable[..., AsyncIterator[Any]], rule: Rule
    ) -> Callable[..., AsyncIterator[Any]]:
        async def stream(
            request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            try:
                caller = await self._caller(context)
                counted = self._open_stream(caller)
            except (
                CoordinatorNotAvailableError,
                SaslAuthenticationError,
                InvalidRequestError,
            ) as exc:
                # After the client's first request, or gRPC may hand the
                # client INTERNAL instead of this (stream_refusal).
                await refuse_stream_with(request_iterator, context, exc)
            try:
                state: dict[str, str] = {}
                denied: list[TidelogError] = []
                #: monotonic time before which the stream is held back (quotas).
                hold_until = [0.0]

                async def checked() -> AsyncIterator[Any]:
                    async for request in request_iterator:
                        error = self._refused(caller, rule, request, state)
                        if error is not None:
                            log.info("denied: %s", error.message)
                            denied.append(error)
                            # Ends the servicer's input; the stream is aborted below.
                            raise error
                        wait_s = hold_until[0] - time.monotonic()
                        if wait_s > 0:
                            await asyncio.sleep(wait_s)
                        if self._metered(caller):
                            throttle_ms = self._throttle_ms(caller, REQUEST_RATE, 1)
                            if rule.quota == "produce":
                                # ByteSize: no copy of the records (a field read would).
                                size = request.ByteSize()
                                throttle_ms = max(
                                    throttle_ms, self._throttle_ms(caller, PRODUCER_BYTE_RATE, size)
                                )
                            if throttle_ms:
                                hold_until[0] = time.monotonic() + throttle_ms / 1000
                        yield request

                try:
                    inner: Any = behavior(checked(), context)
                    async with contextlib.aclosing(inner) as responses:
                        async for response in responses:
                            if denied:
                                break
                            if not rule.quota:
                                yield response
                                continue
                            wait_s = hold_until[0] - time.monotonic()
                            if rule.quota == "fetch":
                                # The answer before went over: hold this one back.
                                if wait_s > 0:
                                    await asyncio.sleep(wait_s)
                                throttle_ms = 0
                                if self._metered(caller):
                                    # A message, or the broker's serialized answer in
                                    # a holder that answers as one (fetch_wire).
                                    throttle_ms = self._throttle_ms(
                                        caller, CONSUMER_BYTE_RATE, response.ByteSize()
                                    )
                                    if throttle_ms:
                                        hold_until[0] = time.monotonic() + throttle_ms / 1000
                            else:
                                # Produce: how long the next request will be held.
                                throttle_ms = int(max(0.0, wait_s) * 1000)
                            if throttle_ms:
                                response.throttle_time_ms = throttle_ms
                            yield response
                except AuthorizationFailedError as exc:
                    denied.append(exc)
                if denied:
                    await _abort(context, denied[0])

            finally:
                if counted:
                    self._close_stream(caller)

        return stream


def _named(request: Any, rule: Rule) -> bool:
    """Whether a listing request names what it wants (then it was checked)."""
    return bool(rule.checks(request, {}))


async def _abort(context: grpc.aio.ServicerContext, error: TidelogError) -> None:
    await context.abort(
        error.grpc_status,
        error.message,
        trailing_metadata=((ERROR_CODE_METADATA_KEY, error.code_name),),
    )
