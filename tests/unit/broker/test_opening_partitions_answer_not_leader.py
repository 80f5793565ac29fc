"""A partition whose log is still being opened answers NOT_LEADER_OR_FOLLOWER
(LogManager._not_served), not UNKNOWN_TOPIC_OR_PARTITION.

More than INLINE_OPEN_MAX new partitions of a topic are opened in worker
threads, and a partition is served only once its log is open. A topic whose
partition states were already known when it arrived (the two watches deliver
in either order; a restarting broker lists both) was unknown to the broker
for as long as its logs opened: produce, fetch and list offsets answered
UNKNOWN_TOPIC_OR_PARTITION, which a raw gRPC client reads as "no such topic",
though Metadata (from etcd) names this broker the leader. Now it answers
NOT_LEADER_OR_FOLLOWER, "still opening", which every client retries;
UNKNOWN_TOPIC_OR_PARTITION stays for topics and partitions that do not exist.

Each test holds the worker thread that opens the logs (a gated `_open_logs`),
asks through the servicers' own request paths meanwhile, then lets it go.
The link is driven with watch batches directly (never started); the etcd
endpoint is real but nothing is read from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from tidelog import Consumer, Producer, TopicPartition
from tidelog.records import encode_batch
from tidelog.v1 import common_pb2, log_pb2
from tidelog_broker.cluster_servicers import ClusterMetadata
from tidelog_broker.config import BrokerConfig
from tidelog_broker.fetch_session import FetchSession
from tidelog_broker.log_servicer import LogServicer, add_log_servicer
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.replica_servicer import ReplicaServicer
from tidelog_broker.topic_store import TopicSpec
from tidelog_server.etcd.records import PartitionState, TopicAssignment
from tidelog_server.etcd.watch import Change, WatchBatch
from tidelog_server.internal import replica_pb2

from tests.support.etcd import EtcdProcess
from tests.unit.broker.test_cluster_link_reconcile import (
    ME,
    OTHER,
    PARTITIONS,
    TOPIC,
    counting_link,
    state_change,
    topic_change,
)

DEADLINE_S = 60.0
BATCH = encode_batch([b"record"])
#: Partitions asked about: led here (0), led by OTHER (1), past the count.
LED, FOLLOWED, MISSING = 0, 1, PARTITIONS
NOT_LEADER = common_pb2.NOT_LEADER_OR_FOLLOWER
UNKNOWN = common_pb2.UNKNOWN_TOPIC_OR_PARTITION


def leader_of(p: int) -> int:
    """The preferred replica of partition p (topic_change's assignment)."""
    return ME if p % 2 == 0 else OTHER


@contextlib.contextmanager
def held_opening(manager: PartitionManager) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Logs opened in a worker thread wait for `release` (`opening` is set
    when the thread starts); released on the way out, whatever happens."""
    opening, release = threading.Event(), threading.Event()
    open_logs = manager.logs._open_logs

    def gated_open_logs(*args: object, **kwargs: object) -> object:
        if threading.current_thread() is not threading.main_thread():
            opening.set()
            release.wait(DEADLINE_S)
        return open_logs(*args, **kwargs)  # type: ignore[arg-type]

    manager.logs._open_logs = gated_open_logs  # type: ignore[method-assign,assignment]
    try:
        yield opening, release
    finally:
        release.set()


async def wait_for(event: threading.Event) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while not event.is_set():
            await asyncio.sleep(0.01)


def produce(servicer: LogServicer, topic: str, partition: int) -> common_pb2.Error:
    """The error of one partition of a Produce request (the servicer's path)."""
    request = log_pb2.ProduceRequest(
        acks=1, partitions=[log_pb2.PartitionRecords(topic=topic, partition=partition)]
    )
    response, _ = servicer._append_request(request, [BATCH])
    return response.partitions[0].error


async def list_offsets(servicer: LogServicer, topic: str, partition: int) -> common_pb2.Error:
    request = log_pb2.ListOffsetsRequest(
        partitions=[log_pb2.ListOffsetsPartition(topic=topic, partition=partition, timestamp_ms=-1)]
    )
    response = await servicer.ListOffsets(request, None)  # type: ignore[arg-type]
    return response.partitions[0].error


async def fetch(manager: PartitionManager, topic: str, partition: int) -> common_pb2.Error:
    """The error of a Fetch session's first answer for the partition."""
    session = FetchSession(manager)
    session.apply(
        log_pb2.FetchRequest(
            positions=[log_pb2.FetchPosition(topic=topic, partition=partition, fetch_offset=0)],
            credit_bytes=1 << 20,
            max_wait_ms=10,
        )
    )
    responses = session.responses()
    try:
        async with asyncio.timeout(DEADLINE_S):
            message = await anext(responses)
    finally:
        await responses.aclose()
    answer = log_pb2.FetchResponse.FromString(message).partitions[0]
    return answer.error


def replica_fetch(manager: PartitionManager, topic: str, partition: int) -> common_pb2.Error:
    """The error the leader's ReplicaFetch answers a follower with."""
    servicer = ReplicaServicer(manager.replicas, BrokerConfig(broker_id=ME))
    request = replica_pb2.ReplicaFetchRequest(
        replica_id=OTHER,
        partitions=[replica_pb2.ReplicaFetchPartition(topic=topic, partition=partition)],
    )
    response, _ = servicer._collect(request, 1 << 20, {})
    return response.partitions[0].error


async def errors_of(
    manager: PartitionManager, servicer: LogServicer, topic: str, partition: int
) -> dict[str, tuple[int, str]]:
    """(code, message) of the partition on every request path that looks it up."""
    answers = {
        "produce": produce(servicer, topic, partition),
        "fetch": await fetch(manager, topic, partition),
        "list_offsets": await list_offsets(servicer, topic, partition),
        "replica_fetch": replica_fetch(manager, topic, partition),
    }
    return {path: (error.code, error.message) for path, error in answers.items()}


def codes(errors: dict[str, tuple[int, str]]) -> set[int]:
    return {code for code, _ in errors.values()}


@dataclass
class Announced:
    """A topic being announced, its logs held opening (`states_then_topic`)."""

    manager: PartitionManager
    link: Any
    servicer: LogServicer
    #: The topics watch's call, hosting the topic.
    hosting: asyncio.Task[None]
    #: Set: the worker thread opens the logs.
    release: threading.Event


@contextlib.asynccontextmanager
async def states_then_topic(etcd: EtcdProcess, tmp_path: Path) -> AsyncIterator[Announced]:
    """A link given every partition state of TOPIC first, then TOPIC itself
    through the topics watch, with its logs held opening in a worker thread."""
    async with counting_link(etcd, tmp_path) as (manager, link, _calls):
        servicer = LogServicer(manager, BrokerConfig(data_dir=tmp_path, broker_id=ME))
        # As if registered (the link is never started): a leader may write.
        manager.replicas.lease_valid = lambda: True
        states = [state_change(link.keys, p, leader_of(p), 0, 3) for p in range(PARTITIONS)]
        await link._on_states(WatchBatch(True, states))
        assert manager.logs.topic_names() == []  # the topic is not known yet
        with held_opening(manager) as (opening, release):
            hosting = asyncio.create_task(
                link._on_topics(WatchBatch(True, [topic_change(link.keys, PARTITIONS, 2)]))
            )
            try:
                await wait_for(opening)
                yield Announced(manager, link, servicer, hosting, release)
            finally:
                release.set()
                async with asyncio.timeout(DEADLINE_S):
                    await asyncio.gather(hosting, return_exceptions=True)


def test_a_new_topics_partitions_answer_not_leader_while_their_logs_open(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    async def run() -> None:
        async with states_then_topic(etcd, tmp_path) as announced:
            manager, servicer = announced.manager, announced.servicer
            assert manager.logs.hosted_partitions(TOPIC) == []
            for partition in (LED, FOLLOWED):
                errors = await errors_of(manager, servicer, TOPIC, partition)
                assert codes(errors) == {NOT_LEADER}, errors
                for _code, message in errors.values():
                    assert "still opening the log" in message, errors
            assert len(manager.logs.opening_partitions(TOPIC)) == PARTITIONS
            # What does not exist stays unknown, also meanwhile.
            assert codes(await errors_of(manager, servicer, TOPIC, MISSING)) == {UNKNOWN}
            assert codes(await errors_of(manager, servicer, "ghost", LED)) == {UNKNOWN}

            announced.release.set()
            async with asyncio.timeout(DEADLINE_S):
                await announced.hosting
            assert manager.logs.opening_partitions(TOPIC) == []
            assert produce(servicer, TOPIC, LED).code == common_pb2.NONE
            follower = await errors_of(manager, servicer, TOPIC, FOLLOWED)
            assert codes(follower) == {NOT_LEADER}, follower
            assert codes(await errors_of(manager, servicer, TOPIC, MISSING)) == {UNKNOWN}

    asyncio.run(run())


def test_a_listed_topic_not_hosted_yet_answers_not_leader(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    # A (re)starting broker lists every topic and reconciles them one after
    # another: while the first one's logs open, the next one is known (its
    # Metadata is answered) but not hosted yet, and must not be "unknown".
    other, count = "queued", 8

    async def run() -> None:
        async with counting_link(etcd, tmp_path) as (manager, link, _calls):
            servicer = LogServicer(manager, BrokerConfig(data_dir=tmp_path, broker_id=ME))
            keys = link.keys
            assignment = TopicAssignment(other, uuid.UUID(int=8).hex, ((ME,),) * count, {})
            led = PartitionState(leader=ME, leader_epoch=0, isr=(ME,)).encode()
            states = [state_change(keys, p, leader_of(p), 0, 3) for p in range(PARTITIONS)] + [
                Change(keys.partition_state(other, p), led, 3, create_revision=3)
                for p in range(count)
            ]
            await link._on_states(WatchBatch(True, states))
            topics = [
                topic_change(keys, PARTITIONS, 2),
                Change(keys.topic(other), assignment.encode(), 2, create_revision=2),
            ]
            with held_opening(manager) as (opening, release):
                listing = asyncio.create_task(link._on_topics(WatchBatch(True, topics)))
                try:
                    await wait_for(opening)
                    for name in (TOPIC, other):
                        errors = await errors_of(manager, servicer, name, LED)
                        assert codes(errors) == {NOT_LEADER}, (name, errors)
                    assert codes(await errors_of(manager, servicer, other, count)) == {UNKNOWN}
                    release.set()
                    async with asyncio.timeout(DEADLINE_S):
                        await listing
                finally:
                    release.set()
                    await asyncio.gather(listing, return_exceptions=True)
            assert manager.logs.hosted_partitions(other) == list(range(count))

    asyncio.run(run())


def test_a_topic_deleted_while_its_logs_open_leaves_nothing_opening(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    # The deletion (topics watch) waits for the hosting in flight; once both
    # are done the topic is unknown again, with no "opening" entry left.
    async def run() -> None:
        async with states_then_topic(etcd, tmp_path) as announced:
            manager, servicer, link = announced.manager, announced.servicer, announced.link
            deleted = asyncio.create_task(
                link._on_topics(WatchBatch(False, [Change(link.keys.topic(TOPIC), None, 20)]))
            )
            await asyncio.sleep(0.05)
            assert not deleted.done()  # it waits for the hosting in flight
            assert produce(servicer, TOPIC, LED).code == NOT_LEADER
            announced.release.set()
            async with asyncio.timeout(DEADLINE_S):
                await asyncio.gather(announced.hosting, deleted)
            assert manager.logs.topic_names() == []
            assert manager.logs.opening_partitions(TOPIC) == []
            assert codes(await errors_of(manager, servicer, TOPIC, LED)) == {UNKNOWN}

    asyncio.run(run())


def test_hosting_cancelled_while_logs_open_leaves_nothing_opening(tmp_path: Path) -> None:
    # A broker stopping cancels the hosting: the partitions are not left
    # "opening" (answering NOT_LEADER_OR_FOLLOWER for ever).
    manager = PartitionManager(BrokerConfig(data_dir=tmp_path, broker_id=ME), cluster_mode=True)
    manager.open()
    spec = TopicSpec(TOPIC, 8, {})

    async def run() -> None:
        with held_opening(manager) as (opening, release):
            hosting = asyncio.create_task(manager.logs.host_partitions_off_loop(spec, range(8)))
            await wait_for(opening)
            assert manager.logs.opening_partitions(TOPIC) == list(range(8))
            hosting.cancel()
            await asyncio.gather(hosting, return_exceptions=True)
            assert manager.logs.opening_partitions(TOPIC) == []
            release.set()
        assert manager.logs.hosted_partitions(TOPIC) == []

    try:
        asyncio.run(run())
        servicer = LogServicer(manager, BrokerConfig(data_dir=tmp_path, broker_id=ME))
        assert produce(servicer, TOPIC, 0).code == UNKNOWN
    finally:
        manager.close()


def test_added_partitions_answer_not_leader_while_their_logs_open(tmp_path: Path) -> None:
    # Partitions added to a topic hosted here: the topic's count grows only
    # once their logs are open; meanwhile they exist (etcd says so, Metadata
    # lists them) and must not answer "no such partition".
    manager = PartitionManager(BrokerConfig(data_dir=tmp_path, broker_id=ME), cluster_mode=True)
    manager.open()
    manager.replicas.lease_valid = lambda: True
    servicer = LogServicer(manager, BrokerConfig(data_dir=tmp_path, broker_id=ME))
    before, after = 2, 10

    async def run() -> None:
        await manager.logs.host_partitions_off_loop(TopicSpec(TOPIC, before, {}), range(before))
        with held_opening(manager) as (opening, release):
            hosting = asyncio.create_task(
                manager.logs.host_partitions_off_loop(TopicSpec(TOPIC, after, {}), range(after))
            )
            await wait_for(opening)
            added = await errors_of(manager, servicer, TOPIC, after - 1)
            assert codes(added) == {NOT_LEADER}, added
            assert codes(await errors_of(manager, servicer, TOPIC, after)) == {UNKNOWN}
            release.set()
            async with asyncio.timeout(DEADLINE_S):
                await hosting
        assert manager.logs.hosted_partitions(TOPIC) == list(range(after))
        assert manager.logs.opening_partitions(TOPIC) == []

    try:
        asyncio.run(run())
    finally:
        manager.close()


def test_the_clients_wait_out_a_partition_still_opening(etcd: EtcdProcess, tmp_path: Path) -> None:
    # The SDK retries NOT_LEADER_OR_FOLLOWER: the producer
    # refreshes metadata and sends again after its backoff; the consumer,
    # fetching from offset 0 with auto_offset_reset="none", neither raises
    # nor resets (a reset would raise), and reads the record once served.
    # The broker's Log service runs on a real gRPC server on this loop.
    tp = TopicPartition(TOPIC, LED)

    def end_offset(address: str) -> int:
        with Consumer(bootstrap_servers=address) as other:
            return other.end_offsets([tp])[tp]

    def clients(address: str, release: threading.Event) -> tuple[int, list[bytes], int]:
        consumer = Consumer(bootstrap_servers=address, auto_offset_reset="none")
        asking = ThreadPoolExecutor(1)
        try:
            consumer.assign([tp])
            consumer.seek(tp, 0)
            assert consumer.poll(timeout_ms=300) == {}  # refused meanwhile: no error
            # end_offsets() (ListOffsets) is asked again until the log is open,
            # within request_timeout_ms, as Kafka's endOffsets is: it used to
            # raise the first NOT_LEADER_OR_FOLLOWER at once.
            end = asking.submit(end_offset, address)
            with contextlib.suppress(FutureTimeout):
                end.result(timeout=2)
            assert not end.done()
            with Producer(bootstrap_servers=address, enable_idempotence=False) as producer:
                future = producer.send(TOPIC, b"v", partition=LED)
                retried = 0.0
                for _ in range(int(DEADLINE_S / 0.05)):
                    retried = producer.metrics()["producer-metrics"]["record-retry-total"]
                    if retried or future.done():
                        break
                    threading.Event().wait(0.05)
                assert retried >= 1 and not future.done()  # refused, retrying
                release.set()
                offset = future.get(timeout=DEADLINE_S).offset
            assert end.result(timeout=DEADLINE_S) in (0, 1)  # before or after the record
            values: list[bytes] = []
            for _ in range(int(DEADLINE_S / 0.5)):
                values += [r.value for r in consumer.poll(timeout_ms=500).get(tp, [])]
                if values:
                    break
            return offset, values, consumer.position(tp)
        finally:
            consumer.close()
            asking.shutdown(wait=True)

    async def run() -> None:
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        async with counting_link(etcd, tmp_path) as (manager, link, _calls):
            manager.replicas.lease_valid = lambda: True  # as if registered
            link.host, link.port = "127.0.0.1", port  # what Metadata names
            config = BrokerConfig(data_dir=tmp_path, broker_id=ME)
            add_log_servicer(LogServicer(manager, config, ClusterMetadata(link).metadata), server)
            await server.start()
            try:
                states = [state_change(link.keys, p, leader_of(p), 0, 3) for p in range(PARTITIONS)]
                # LED's ISR is its leader alone (OTHER never fetches), so its
                # high watermark follows its log end and the record is readable.
                alone = PartitionState(leader=ME, leader_epoch=0, isr=(ME,)).encode()
                states[LED] = Change(link.keys.partition_state(TOPIC, LED), alone, 3, 3)
                await link._on_states(WatchBatch(True, states))
                with held_opening(manager) as (opening, release):
                    hosting = asyncio.create_task(
                        link._on_topics(WatchBatch(True, [topic_change(link.keys, PARTITIONS, 2)]))
                    )
                    try:
                        await wait_for(opening)
                        address = f"127.0.0.1:{port}"
                        offset, values, position = await asyncio.to_thread(
                            clients, address, release
                        )
                    finally:
                        release.set()
                        async with asyncio.timeout(DEADLINE_S):
                            await asyncio.gather(hosting, return_exceptions=True)
                assert (offset, values, position) == (0, [b"v"], 1)
            finally:
                await server.stop(None)

    asyncio.run(run())
