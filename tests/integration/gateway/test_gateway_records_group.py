"""`Records.Consume` as a member of a consumer group, through a real gateway
in front of real etcd, coordinator and brokers: assignment changes on the
stream, commits on the stream, and what happens to a stream's partitions
when it ends (they move; what was not committed is delivered again)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from tidelog import AdminClient, NewTopic
from tidelog.v1 import common_pb2, group_pb2, records_pb2, records_pb2_grpc

from tests.support.cluster import ClusterProcesses
from tests.support.gateway import GatewayProcess, start_gateway

pytestmark = pytest.mark.timeout(180)

PARTITIONS = 4
PER_PARTITION = 10
DEADLINE_S = 60.0

TP = tuple[str, int]


class GroupStream:
    """One Consume stream in a group, driven from the test: requests go in
    through a queue, responses are read by a thread and kept by kind."""

    def __init__(self, stub: records_pb2_grpc.RecordsStub, first: records_pb2.ConsumeRequest):
        self._requests: queue.Queue[records_pb2.ConsumeRequest | None] = queue.Queue()
        self._requests.put(first)
        self.records: list[records_pb2.ConsumedRecord] = []
        self.changes: list[records_pb2.AssignmentChange] = []
        self.commits: dict[int, records_pb2.CommitResult] = {}
        self.error: grpc.RpcError | None = None
        self._lock = threading.Lock()
        self._call = stub.Consume(self._send(), timeout=DEADLINE_S * 3)
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _send(self) -> Iterator[records_pb2.ConsumeRequest]:
        while (request := self._requests.get()) is not None:
            yield request

    def _receive(self) -> None:
        try:
            for response in self._call:
                with self._lock:
                    self.records.extend(response.records)
                    if response.HasField("assignment"):
                        self.changes.append(response.assignment)
                    if response.HasField("commit"):
                        self.commits[response.commit.correlation_id] = response.commit
        except grpc.RpcError as exc:
            self.error = exc

    def send(self, request: records_pb2.ConsumeRequest) -> None:
        self._requests.put(request)

    def commit(self, correlation_id: int, offsets: dict[TP, int]) -> records_pb2.CommitResult:
        self.send(
            records_pb2.ConsumeRequest(
                commit=records_pb2.ConsumeCommit(
                    correlation_id=correlation_id,
                    offsets=[
                        group_pb2.OffsetCommit(topic=t, partition=p, offset=o)
                        for (t, p), o in offsets.items()
                    ],
                )
            )
        )
        wait_until(lambda: correlation_id in self.commits, f"commit {correlation_id} answered")
        return self.commits[correlation_id]

    def owned(self) -> set[TP]:
        with self._lock:
            if not self.changes:
                return set()
            return {(tp.topic, tp.partition) for tp in self.changes[-1].owned}

    def values(self, partitions: set[TP] | None = None) -> list[str]:
        with self._lock:
            return [
                r.value_text
                for r in self.records
                if partitions is None or (r.topic, r.partition) in partitions
            ]

    def end(self) -> None:
        """The client goes away mid-stream (cancels the call)."""
        self._requests.put(None)
        self._call.cancel()
        self._thread.join(10)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S} s: {what}")
        time.sleep(0.05)


#: A session no test outlives: partitions that move within a test's
#: deadline moved because their member left, not because its session expired.
LONG_SESSION_MS = 300_000


def join(
    stub: records_pb2_grpc.RecordsStub,
    topic: str,
    group: str,
    credit: int = 1000,
    session_timeout_ms: int = 6000,
) -> GroupStream:
    return GroupStream(
        stub,
        records_pb2.ConsumeRequest(
            text=True,
            credit_records=credit,
            group=records_pb2.ConsumeGroup(
                group_id=group, topics=[topic], session_timeout_ms=session_timeout_ms
            ),
        ),
    )


def produce(
    stub: records_pb2_grpc.RecordsStub,
    topic: str,
    start: int,
    count: int,
    partitions: int = PARTITIONS,
) -> None:
    records = [
        records_pb2.ProduceRecord(topic=topic, partition=p, value_text=f"{p}:{i}")
        for p in range(partitions)
        for i in range(start, start + count)
    ]
    answers = list(
        stub.Produce(
            iter([records_pb2.RecordsProduceRequest(records=records, acks=records_pb2.ACKS_ALL)]),
            timeout=60,
        )
    )
    assert all(not r.HasField("error") for r in answers[0].results)


def expected(partitions: set[TP], start: int, end: int) -> set[str]:
    return {f"{p}:{i}" for _, p in partitions for i in range(start, end)}


def test_group_streams_share_partitions_commit_and_take_over(
    gateway: GatewayProcess, names: tuple[str, str]
) -> None:
    topic, group = names
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS)])
    everything = {(topic, p) for p in range(PARTITIONS)}
    with grpc.insecure_channel(gateway.address) as channel:
        stub = records_pb2_grpc.RecordsStub(channel)
        produce(stub, topic, 0, PER_PARTITION)

        # a's session outlasts the test: its partitions move because its stream ends.
        a = join(stub, topic, group, session_timeout_ms=LONG_SESSION_MS)
        wait_until(lambda: a.owned() == everything, "the first member owns every partition")
        wait_until(lambda: len(a.values()) == PARTITIONS * PER_PARTITION, "a reads everything")
        assert set(a.values()) == expected(everything, 0, PER_PARTITION)
        first_change = a.changes[0]
        assert {(tp.topic, tp.partition) for tp in first_change.assigned} == everything
        # a has processed everything but commits only the first half of each partition.
        ok = a.commit(1, {tp: PER_PARTITION // 2 for tp in everything})
        assert not ok.HasField("error"), ok.error.message

        b = join(stub, topic, group)
        wait_until(
            lambda: len(a.owned()) == len(b.owned()) == PARTITIONS // 2,
            "the two members share the partitions",
        )
        moved = b.owned()
        assert moved.isdisjoint(a.owned())
        assert any(
            {(tp.topic, tp.partition) for tp in change.revoked} == moved for change in a.changes
        )
        # b starts where the group committed: the uncommitted half is delivered again.
        half = expected(moved, PER_PARTITION // 2, PER_PARTITION)
        wait_until(lambda: set(b.values()) == half, "b reads from the committed offsets")
        assert len(b.values()) == len(half)

        # a may no longer commit what moved; nothing of that commit is applied.
        refused = a.commit(2, {tp: PER_PARTITION for tp in everything})
        assert refused.error.code == common_pb2.ILLEGAL_GENERATION
        assert "not assigned to this stream" in refused.error.message
        kept = a.owned()
        ok = a.commit(3, {tp: PER_PARTITION for tp in kept})
        assert not ok.HasField("error"), ok.error.message

        # a goes away: its partitions move to b, from what a committed.
        produce(stub, topic, PER_PARTITION, 2)
        a.end()
        wait_until(lambda: b.owned() == everything, "b takes over a's partitions")
        wait_until(
            lambda: (
                set(b.values()) == half | expected(everything, PER_PARTITION, PER_PARTITION + 2)
            ),
            "b reads a's partitions from a's commits and all new records",
        )
        ok = b.commit(1, {tp: PER_PARTITION + 2 for tp in everything})
        assert not ok.HasField("error"), ok.error.message
        b.end()

        # A new member starts from the commits made on the streams.
        produce(stub, topic, PER_PARTITION + 2, 1)
        c = join(stub, topic, group)
        try:
            wait_until(lambda: len(c.values()) == PARTITIONS, "c reads the new records")
            assert set(c.values()) == expected(everything, PER_PARTITION + 2, PER_PARTITION + 3)
        finally:
            c.end()


def test_group_stream_is_paced_by_credit(gateway: GatewayProcess, names: tuple[str, str]) -> None:
    topic, group = names
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, 1)])
    with grpc.insecure_channel(gateway.address) as channel:
        stub = records_pb2_grpc.RecordsStub(channel)
        produce(stub, topic, 0, 10, partitions=1)
        stream = join(stub, topic, group, credit=0)
        try:
            # The assignment comes without credit; records only with it.
            wait_until(lambda: stream.owned() == {(topic, 0)}, "assigned without credit")
            stream.send(records_pb2.ConsumeRequest(credit_records=3))
            wait_until(lambda: len(stream.values()) == 3, "three records for three credits")
            ok = stream.commit(1, {(topic, 0): 3})
            assert not ok.HasField("error"), ok.error.message
            assert stream.values() == ["0:0", "0:1", "0:2"]
            stream.send(records_pb2.ConsumeRequest(credit_records=2))
            wait_until(lambda: len(stream.values()) == 5, "two more")
            assert stream.values()[3:] == ["0:3", "0:4"]
        finally:
            stream.end()


def consume_error(
    stub: records_pb2_grpc.RecordsStub, *requests: records_pb2.ConsumeRequest
) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        for _ in stub.Consume(iter(requests), timeout=30):
            pass
    return caught.value


def test_group_requests_past_the_limits_are_refused_naming_them(
    gateway: GatewayProcess, names: tuple[str, str]
) -> None:
    topic, group = names
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, 1)])

    def first(**fields: object) -> records_pb2.ConsumeRequest:
        settings: dict[str, object] = {"group_id": group, "topics": [topic]}
        settings.update(fields)
        return records_pb2.ConsumeRequest(group=records_pb2.ConsumeGroup(**settings))  # type: ignore[arg-type]

    with grpc.insecure_channel(gateway.address) as channel:
        stub = records_pb2_grpc.RecordsStub(channel)
        cases = [
            (first(group_id=""), grpc.StatusCode.INVALID_ARGUMENT, "249"),
            (first(group_id="g" * 250), grpc.StatusCode.INVALID_ARGUMENT, "249"),
            (first(topics=[]), grpc.StatusCode.INVALID_ARGUMENT, "1000"),
            (first(topics=[topic] * 1001), grpc.StatusCode.INVALID_ARGUMENT, "1000"),
            (first(topics=[f"{topic}-missing"]), grpc.StatusCode.NOT_FOUND, "-missing"),
            (first(session_timeout_ms=1000), grpc.StatusCode.INVALID_ARGUMENT, "300000"),
            (first(reset=7), grpc.StatusCode.INVALID_ARGUMENT, "EARLIEST or LATEST"),
        ]
        for request, code, named in cases:
            error = consume_error(stub, request)
            assert (error.code(), named in (error.details() or "")) == (code, True), (
                request,
                error.details(),
            )
        positions = first()
        positions.positions.add(topic=topic, partition=0, offset=0)
        error = consume_error(stub, positions)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "positions" in (error.details() or "")
        commit = records_pb2.ConsumeRequest(
            commit=records_pb2.ConsumeCommit(
                offsets=[group_pb2.OffsetCommit(topic=topic, partition=0, offset=1)] * 10_001
            )
        )
        error = consume_error(stub, first(), commit)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "10000" in (error.details() or "")
        # Commits need a group stream.
        explicit = records_pb2.ConsumeRequest(
            positions=[records_pb2.ConsumePosition(topic=topic, partition=0, offset=0)],
            commit=records_pb2.ConsumeCommit(correlation_id=1),
        )
        error = consume_error(stub, explicit)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "group" in (error.details() or "")

        # A commit with a negative offset is answered with its error; the stream goes on.
        stream = join(stub, topic, group, credit=0)
        try:
            wait_until(lambda: stream.owned() == {(topic, 0)}, "assigned")
            bad = stream.commit(7, {(topic, 0): -1})
            assert bad.error.code == common_pb2.INVALID_REQUEST
            assert ">= 0" in bad.error.message
            assert stream.error is None
        finally:
            stream.end()


def test_a_member_whose_gateway_dies_loses_its_partitions_after_the_session_timeout(
    gateway: GatewayProcess,
    cluster: ClusterProcesses,
    names: tuple[str, str],
    tmp_path: Path,
) -> None:
    """The gateway serving a's stream is SIGKILLed: nobody leaves the group
    for a, so its partitions move to b (on another gateway) once a's session
    times out, from what a committed."""
    topic, group = names
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS)])
    everything = {(topic, p) for p in range(PARTITIONS)}
    doomed = start_gateway(cluster.etcd.endpoint, tmp_path, prefix=cluster.prefix)
    try:
        with (
            grpc.insecure_channel(doomed.address) as doomed_channel,
            grpc.insecure_channel(gateway.address) as channel,
        ):
            stub = records_pb2_grpc.RecordsStub(channel)
            produce(stub, topic, 0, PER_PARTITION)
            a = join(records_pb2_grpc.RecordsStub(doomed_channel), topic, group)
            wait_until(lambda: a.owned() == everything, "a owns every partition")
            wait_until(lambda: len(a.values()) == PARTITIONS * PER_PARTITION, "a reads it all")
            ok = a.commit(1, {tp: 3 for tp in everything})
            assert not ok.HasField("error"), ok.error.message
            b = join(stub, topic, group)
            try:
                wait_until(lambda: len(b.owned()) == PARTITIONS // 2, "b gets its share")
                doomed.kill()
                wait_until(lambda: b.owned() == everything, "b gets a's partitions too")
                wait_until(
                    lambda: set(b.values()) == expected(everything, 3, PER_PARTITION),
                    "b reads every partition from a's commits",
                )
                assert len(b.values()) == PARTITIONS * (PER_PARTITION - 3)
            finally:
                b.end()
            a.end()
    finally:
        doomed.kill()


def test_a_draining_gateway_ends_group_streams_and_their_members_leave(
    gateway: GatewayProcess,
    cluster: ClusterProcesses,
    names: tuple[str, str],
    tmp_path: Path,
) -> None:
    """SIGTERM: a's stream ends with UNAVAILABLE (the client consumes again
    elsewhere) and a leaves the group, so its partitions move to b at once
    (a's session would outlast the test)."""
    topic, group = names
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS)])
    everything = {(topic, p) for p in range(PARTITIONS)}
    draining = start_gateway(cluster.etcd.endpoint, tmp_path, prefix=cluster.prefix)
    try:
        with (
            grpc.insecure_channel(draining.address) as draining_channel,
            grpc.insecure_channel(gateway.address) as channel,
        ):
            stub = records_pb2_grpc.RecordsStub(channel)
            a = join(
                records_pb2_grpc.RecordsStub(draining_channel),
                topic,
                group,
                session_timeout_ms=LONG_SESSION_MS,
            )
            wait_until(lambda: a.owned() == everything, "a owns every partition")
            b = join(stub, topic, group)
            try:
                wait_until(lambda: len(b.owned()) == PARTITIONS // 2, "b gets its share")
                assert draining.stop() == 0
                wait_until(lambda: a.error is not None, "a's stream ends")
                assert a.error is not None and a.error.code() == grpc.StatusCode.UNAVAILABLE
                wait_until(lambda: b.owned() == everything, "b gets a's partitions")
            finally:
                b.end()
            a.end()
    finally:
        draining.kill()
