"""CommitOffsetsStream through real coordinator processes on a real etcd:
answers matched by correlation id (in the order commits finish), typed
errors per request, the SDK committing over the stream, failing over to
another replica mid-stream, and falling back to the unary CommitOffsets
where the stream is not served (the gateway); each request authorized as
a CommitOffsets, and the stream counted against --max-streams-per-principal.

The stream's durability under SIGKILL is in test_offset_commit_durability.py;
the in-flight bound (a client that never reads) in
tests/unit/coordinator/test_commit_stream.py."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from tidelog.errors import (
    GroupAuthorizationFailedError,
    IllegalGenerationError,
    InvalidRequestError,
    TopicAuthorizationFailedError,
    UnknownMemberIdError,
)
from tidelog.group import GroupMembership, OffsetStoreClient
from tidelog.types import TopicPartition
from tidelog.v1 import common_pb2, group_pb2, group_pb2_grpc
from tidelog_coordinator.group_limits import PARTITIONS_MAX
from tidelog_server.acls import AclBinding
from tidelog_server.etcd.keys import Keys

from tests.integration.coordinator.conftest import StartCoordinator
from tests.integration.coordinator.group_support import (
    credentials,
    joined_member,
    offset_client,
    setup_topic,
)
from tests.integration.coordinator.helpers import etcd_client
from tests.support.etcd import EtcdProcess
from tests.support.gateway import start_gateway

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 4
#: The stand-in broker's registration outlives every test of the module.
BROKER_TTL_S = 120
T0 = TopicPartition("t", 0)


async def _setup(etcd: EtcdProcess, prefix: str, address: str) -> None:
    """Topic "t" with PARTITIONS partitions."""
    await setup_topic(etcd, prefix, address, "t", PARTITIONS, broker_ttl_s=BROKER_TTL_S)


def _commit(
    member: GroupMembership, offset: int, **changes: object
) -> group_pb2.CommitOffsetsRequest:
    request = group_pb2.CommitOffsetsRequest(
        group_id=member.group_id,
        member_id=member.member_id,
        member_epoch=member.member_epoch,
        member_token=member.member_token,
        offsets=[group_pb2.OffsetCommit(topic="t", partition=0, offset=offset)],
    )
    for name, value in changes.items():
        if isinstance(value, list):
            del getattr(request, name)[:]
            getattr(request, name).extend(value)
        else:
            setattr(request, name, value)
    return request


class RawStream:
    """A CommitOffsetsStream written and read by the test."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.requests: asyncio.Queue[group_pb2.CommitOffsetsStreamRequest | None] = asyncio.Queue()
        self.call = group_pb2_grpc.GroupStub(channel).CommitOffsetsStream(self._requests())
        self.ready: list[group_pb2.CommitOffsetsStreamAnswer] = []

    async def _requests(self) -> AsyncIterator[group_pb2.CommitOffsetsStreamRequest]:
        while (request := await self.requests.get()) is not None:
            yield request

    def send(self, correlation_id: int, commit: group_pb2.CommitOffsetsRequest) -> None:
        """One message with one commit."""
        self.requests.put_nowait(
            group_pb2.CommitOffsetsStreamRequest(
                commits=[group_pb2.StreamedCommit(correlation_id=correlation_id, commit=commit)]
            )
        )

    async def answer(self) -> group_pb2.CommitOffsetsStreamAnswer:
        """The next answer (a message may carry several)."""
        if not self.ready:
            message = await asyncio.wait_for(self.call.read(), 30)
            assert isinstance(message, group_pb2.CommitOffsetsStreamResponse), message
            self.ready.extend(message.answers)
        return self.ready.pop(0)


def test_answers_come_out_of_order_matched_by_correlation_id(
    tmp_path: Path, prefix: str, coordinators: StartCoordinator
) -> None:
    """A commit waiting for etcd (paused with SIGSTOP) is answered after a
    later request that needs no etcd; each answer names its request."""
    own = EtcdProcess.start(tmp_path / "etcd")  # paused below: not the module's etcd
    try:
        coordinator = coordinators(etcd_endpoint=own.endpoint)

        async def run() -> None:
            await _setup(own, prefix, coordinator.address)
            async with joined_member(coordinator.address, PARTITIONS) as member:
                async with grpc.aio.insecure_channel(coordinator.address) as channel:
                    stream = RawStream(channel)
                    stream.send(1, _commit(member, 11))
                    first = await stream.answer()  # the stream works: committed
                    assert (first.correlation_id, first.HasField("error")) == (1, False)
                    assert own.proc is not None
                    os.kill(own.proc.pid, signal.SIGSTOP)
                    try:
                        stream.send(7, _commit(member, 12))
                        # Refused before etcd is asked: no partitions named twice.
                        twice = [group_pb2.OffsetCommit(topic="t", partition=1, offset=1)] * 2
                        stream.send(3, _commit(member, 0, offsets=twice))
                        early = await stream.answer()
                        assert early.correlation_id == 3, early
                        assert early.error.code == common_pb2.INVALID_REQUEST
                        assert "appears twice" in early.error.message
                    finally:
                        os.kill(own.proc.pid, signal.SIGCONT)
                    late = await stream.answer()
                    assert (late.correlation_id, late.HasField("error")) == (7, False)
                    stream.requests.put_nowait(None)
                    assert await stream.call.read() is grpc.aio.EOF  # ends once all answered
                    assert await stream.call.code() == grpc.StatusCode.OK
                assert (await member.committed([T0]))[T0].offset == 12

        asyncio.run(run())
    finally:
        own.stop()


def test_each_request_of_the_stream_gets_its_own_typed_error(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators()

    async def run() -> None:
        await _setup(etcd, prefix, coordinator.address)
        async with joined_member(coordinator.address, PARTITIONS) as member:
            async with grpc.aio.insecure_channel(coordinator.address) as channel:
                stream = RawStream(channel)
                too_many = [
                    group_pb2.OffsetCommit(topic="t", partition=p, offset=1)
                    for p in range(PARTITIONS_MAX + 1)
                ]
                missing = [group_pb2.OffsetCommit(topic="t", partition=99)]
                cases = {
                    1: (_commit(member, 5, member_epoch=member.member_epoch + 7),
                        common_pb2.ILLEGAL_GENERATION),
                    2: (_commit(member, 5, member_token="not-the-token"),
                        common_pb2.UNKNOWN_MEMBER_ID),
                    3: (_commit(member, 5, member_id="nobody"), common_pb2.UNKNOWN_MEMBER_ID),
                    4: (_commit(member, 5, offsets=missing), common_pb2.UNKNOWN_TOPIC_OR_PARTITION),
                    5: (_commit(member, 5, offsets=too_many), common_pb2.INVALID_REQUEST),
                    6: (_commit(member, 5), common_pb2.NONE),
                }  # fmt: skip
                for correlation_id, (request, _) in cases.items():
                    stream.send(correlation_id, request)
                answers = {a.correlation_id: a for a in [await stream.answer() for _ in cases]}
                assert {c: a.error.code for c, a in answers.items()} == {
                    c: code for c, (_, code) in cases.items()
                }
                # The partitions limit is named, as for the unary call.
                assert str(PARTITIONS_MAX) in answers[5].error.message
                stream.requests.put_nowait(None)
                assert await stream.call.code() == grpc.StatusCode.OK
            # The same through the SDK, which commits over the stream.
            async with offset_client(coordinator.address) as client:
                offsets = {T0: 9}
                with pytest.raises(IllegalGenerationError):
                    await client.commit("g", offsets, **credentials(member, epoch_delta=-1))
                with pytest.raises(UnknownMemberIdError):
                    await client.commit("g", offsets, **credentials(member, token="wrong"))
                with pytest.raises(InvalidRequestError, match=str(PARTITIONS_MAX)):
                    await client.commit(
                        "g",
                        {TopicPartition("t", p): 1 for p in range(PARTITIONS_MAX + 1)},
                        **credentials(member),
                    )
                await client.commit("g", offsets, **credentials(member))
                assert (await client.fetch("g", [T0]))[T0].offset == 9

    asyncio.run(run())


#: Commits on the stream when its coordinator ends.
COMMITS_IN_FLIGHT = 8
#: Generous: the client notices the end, picks the other replica, retries each.
FAILOVER_DEADLINE_S = 60


@pytest.mark.parametrize("end", ["SIGKILL", "SIGTERM"])
def test_the_sdk_commit_fails_over_to_another_replica_mid_stream(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator, end: str
) -> None:
    """The coordinator holding the stream dies (SIGKILL) or shuts down
    (SIGTERM: it answers what it has read and ends the stream) with commits
    in flight: each is retried on the other replica and succeeds."""
    first = coordinators()
    second = coordinators()

    async def run() -> None:
        await _setup(etcd, prefix, first.address)
        async with (
            joined_member(second.address, PARTITIONS) as member,
            offset_client([first.address, second.address], request_timeout_ms=5_000) as client,
        ):

            async def commit(offset: int) -> None:
                await client.commit(
                    "g",
                    {TopicPartition("t", p): offset for p in range(PARTITIONS)},
                    **credentials(member),
                )

            await commit(1)  # the stream to `first` is open now
            # Commits in flight on the stream while its coordinator dies.
            in_flight = [asyncio.ensure_future(commit(2)) for _ in range(COMMITS_IN_FLIGHT)]
            await asyncio.sleep(0)  # written
            if end == "SIGKILL":
                first.kill()
            else:
                await asyncio.get_running_loop().run_in_executor(None, first.stop)
            await asyncio.wait_for(asyncio.gather(*in_flight), FAILOVER_DEADLINE_S)
            await commit(3)
            fetched = await client.fetch("g")
            assert {tp: om.offset for tp, om in fetched.items()} == {
                TopicPartition("t", p): 3 for p in range(PARTITIONS)
            }

    asyncio.run(run())


def test_the_sdk_falls_back_to_unary_commits_where_the_stream_is_unimplemented(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator, tmp_path: Path
) -> None:
    """The gateway does not relay the commit stream (UNIMPLEMENTED): the SDK
    commits through it with CommitOffsets, errors typed as ever."""
    coordinator = coordinators()
    gateway = start_gateway(etcd.endpoint, tmp_path / "logs", prefix=prefix)
    try:

        async def run() -> None:
            await _setup(etcd, prefix, coordinator.address)
            async with (
                joined_member(gateway.address, PARTITIONS) as member,
                offset_client(gateway.address) as client,
            ):
                async with grpc.aio.insecure_channel(gateway.address) as channel:
                    call = group_pb2_grpc.GroupStub(channel).CommitOffsetsStream(iter(()))
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await call.read()
                    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
                await client.commit("g", {T0: 42}, **credentials(member))
                with pytest.raises(IllegalGenerationError):
                    await client.commit("g", {T0: 43}, **credentials(member, epoch_delta=3))
                assert (await client.fetch("g", [T0]))[T0].offset == 42

        asyncio.run(run())
    finally:
        gateway.stop()


def test_each_request_is_authorized_as_a_commit_and_a_denied_one_ends_the_stream_typed(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    """ACLs enforced (--allow-everyone-if-no-acl-found false): User:ANONYMOUS
    may Read group "allowed" and topic "t", nothing else. On one stream, a
    commit to "allowed" goes through; one to "denied" ends the stream with
    GROUP_AUTHORIZATION_FAILED; the SDK raises that, typed, and commits to
    "allowed" again on a new stream."""
    grants = [
        AclBinding.checked("cluster", "", "literal", "User:ANONYMOUS", "*", "Create", "allow"),
        AclBinding.checked("topic", "t", "literal", "User:ANONYMOUS", "*", "Read", "allow"),
        AclBinding.checked("group", "allowed", "literal", "User:ANONYMOUS", "*", "Read", "allow"),
    ]

    async def grant() -> None:
        async with etcd_client(etcd.endpoint) as client:
            for binding in grants:
                await client.put(Keys(prefix).acl(binding.binding_id), binding.encode())

    asyncio.run(grant())
    coordinator = coordinators(extra_args=("--allow-everyone-if-no-acl-found", "false"))

    async def run() -> None:
        await _setup(etcd, prefix, coordinator.address)
        async with (
            joined_member(coordinator.address, PARTITIONS, "allowed") as member,
            offset_client(coordinator.address) as client,
        ):
            async with grpc.aio.insecure_channel(coordinator.address) as channel:
                stream = RawStream(channel)
                stream.send(1, _commit(member, 3))
                assert (await stream.answer()).HasField("error") is False
                stream.send(2, _commit(member, 4, group_id="denied"))
                with pytest.raises(grpc.aio.AioRpcError) as denied:
                    await stream.answer()
                assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "Read group 'denied'" in (denied.value.details() or "")
            await client.commit("allowed", {T0: 5}, **credentials(member))
            with pytest.raises(GroupAuthorizationFailedError, match="Read group 'denied'"):
                await client.commit("denied", {T0: 6}, **credentials(member))
            await client.commit("allowed", {T0: 7}, **credentials(member))
            assert (await client.fetch("allowed", [T0]))[T0].offset == 7

    asyncio.run(run())


def test_without_acls_commits_pass_until_an_acl_refuses_them(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    """The default: no ACL, --allow-everyone-if-no-acl-found true (the
    coordinator then lists no checks per commit). A deny binding added
    while it runs (Read on topic "t" for User:ANONYMOUS) refuses unary and
    streamed commits, TOPIC_AUTHORIZATION_FAILED; once removed, commits
    pass again."""
    coordinator = coordinators()
    deny = AclBinding.checked("topic", "t", "literal", "User:ANONYMOUS", "*", "Read", "deny")
    key = Keys(prefix).acl(deny.binding_id)

    async def until(
        commits: bool, client: OffsetStoreClient, member: GroupMembership, offset: int
    ) -> None:
        """Commit until the outcome is `commits` (the ACL arrives by watch)."""
        async with asyncio.timeout(30):
            while True:
                try:
                    await client.commit("g", {T0: offset}, **credentials(member))
                    if commits:
                        return
                except TopicAuthorizationFailedError as exc:
                    assert "Read topic 't'" in exc.message
                    if not commits:
                        return
                await asyncio.sleep(0.1)

    async def streamed(member: GroupMembership, offset: int) -> group_pb2.CommitOffsetsStreamAnswer:
        async with grpc.aio.insecure_channel(coordinator.address) as channel:
            stream = RawStream(channel)
            stream.send(1, _commit(member, offset))
            return await stream.answer()

    async def run() -> None:
        await _setup(etcd, prefix, coordinator.address)
        async with (
            joined_member(coordinator.address, PARTITIONS, "g") as member,
            offset_client(coordinator.address) as client,
            etcd_client(etcd.endpoint) as etcd_kv,
        ):
            assert not (await streamed(member, 1)).HasField("error")
            await client.commit("g", {T0: 2}, **credentials(member))
            await etcd_kv.put(key, deny.encode())
            await until(False, client, member, 3)
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await streamed(member, 4)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "Read topic 't'" in (denied.value.details() or "")
            # (FetchOffsets needs Describe on "t": no ACL allows it while one names "t".)
            await etcd_kv.delete(key)
            await until(True, client, member, 5)
            assert not (await streamed(member, 6)).HasField("error")
            assert (await client.fetch("g", [T0]))[T0].offset == 6

    asyncio.run(run())


STREAMS_PER_PRINCIPAL_MAX = 2


def test_commit_streams_count_against_the_streams_per_principal_limit(
    etcd: EtcdProcess, prefix: str, coordinators: StartCoordinator
) -> None:
    coordinator = coordinators(
        extra_args=("--max-streams-per-principal", str(STREAMS_PER_PRINCIPAL_MAX))
    )
    limit = f"max-streams-per-principal={STREAMS_PER_PRINCIPAL_MAX}"

    async def run() -> None:
        await _setup(etcd, prefix, coordinator.address)
        async with grpc.aio.insecure_channel(coordinator.address) as channel:
            streams = [RawStream(channel) for _ in range(STREAMS_PER_PRINCIPAL_MAX)]
            for i, stream in enumerate(streams):  # open and counted once answered
                stream.send(i, group_pb2.CommitOffsetsRequest())
                assert (await stream.answer()).error.code == common_pb2.INVALID_REQUEST
            third = RawStream(channel)
            third.send(9, group_pb2.CommitOffsetsRequest())
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await third.answer()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"--{limit}" in (refused.value.details() or "")
            # Through the SDK: the limit, typed, never retried as an outage.
            async with offset_client(coordinator.address) as client:
                with pytest.raises(InvalidRequestError, match=limit):
                    await client.commit(
                        "g", {T0: 1}, member_id="m", member_epoch=1, member_token="x"
                    )
            for stream in streams:
                stream.requests.put_nowait(None)
                assert await stream.call.code() == grpc.StatusCode.OK

    asyncio.run(run())
