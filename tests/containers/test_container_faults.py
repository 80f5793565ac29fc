"""Faults on the cluster in containers, through the gateway (issue 12): a leader's container
killed in the middle of an acks=all produce; a broker container recreated on its volume;
a leader's container paused for longer than its lease."""

from __future__ import annotations

import re
import threading
import time

import grpc
import pytest
from tidelog import AdminClient, NewTopic, records
from tidelog.v1 import common_pb2, log_pb2, log_pb2_grpc

from tests.containers.cluster import SESSION_TTL_S, ContainerCluster
from tests.fault.replication_support import AckedProducer, compare, read_back

#: Room for a first, cold build of the images (tests/containers/test_images.py).
pytestmark = [pytest.mark.xdist_group("containers"), pytest.mark.timeout(1200)]

#: Produce options of every workload here: acknowledged only once every in-sync replica
#: has the record (and min.insync.replicas=2 of 3 must be in sync).
ACKS_ALL = {"acks": "all", "linger_ms": 5, "delivery_timeout_ms": 120_000}


def create_topic(cluster: ContainerCluster, name: str, partitions: int) -> None:
    assert cluster.gateway is not None
    with AdminClient(bootstrap_servers=cluster.gateway.address) as admin:
        admin.create_topics(
            [NewTopic(name, partitions, 3, topic_configs={"min.insync.replicas": "2"})]
        )
    cluster.wait_isr(name, [0, 1, 2], 30)


def wait_until(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not within {timeout_s} s")


def test_leader_container_killed_during_an_acks_all_produce_loses_nothing_acknowledged(
    cluster: ContainerCluster,
) -> None:
    assert cluster.gateway is not None
    create_topic(cluster, "payments", 3)
    producer = AckedProducer(cluster.gateway.address, "payments", 3, 20_000, 10, **ACKS_ALL)
    producer.start()
    wait_until(lambda: producer.acked_count() >= 2_000, 60, "2000 records acknowledged")
    victim = cluster.leaders("payments")[0]
    killed_at = time.monotonic()
    cluster.brokers[victim].docker.kill()  # SIGKILL, as `docker kill`
    producer.join(180)
    assert producer.error is None, producer.error

    survivors = sorted(set(cluster.brokers) - {victim})
    leaders = cluster.leaders("payments", skip=(victim,))
    assert leaders and all(leader in survivors for leader in leaders.values()), leaders
    read = read_back(cluster.gateway.address, "payments", 3, 60)
    verdict = compare(producer.acked, read)
    after_kill = sum(1 for t in producer.ack_times if t > killed_at)
    print(f"\nkilled broker {victim}: {verdict}, {after_kill} acknowledged after the kill")
    assert after_kill > 0, "nothing was acknowledged after the leader's container was killed"
    assert verdict.lost == 0, verdict
    # The idempotent producer (on with acks=all) writes each record once, retries included.
    assert verdict.duplicates == 0, verdict


def test_broker_container_recreated_on_its_volume_rejoins_and_catches_up(
    cluster: ContainerCluster,
) -> None:
    assert cluster.gateway is not None
    create_topic(cluster, "ledger", 2)
    first = AckedProducer(cluster.gateway.address, "ledger", 2, 2_000, **ACKS_ALL)
    first.start()
    first.join(120)
    assert first.error is None and first.acked_count() == 2_000, (first.error, first.failed)

    cluster.remove_broker(2)
    # Written while broker 2 is gone: it can only get these from the others, when it is back.
    # (Its value prefix is the partition; seqs go on from where the first producer stopped.)
    second = AckedProducer(cluster.gateway.address, "ledger", 2, 2_000, **ACKS_ALL)
    second.sent = [1_000, 1_000]
    second.start()
    second.join(180)
    assert second.error is None and second.acked_count() == 2_000, (second.error, second.failed)
    cluster.wait_isr("ledger", [0, 1], 30)

    recreated = cluster.recreate_broker(2)
    # It found its logs on the volume: the first producer's 1000 records per partition.
    for partition in (0, 1):
        found = re.compile(rf"ledger-{partition}: follower, .* log end 1000\b")
        wait_until(lambda f=found: f.search(recreated.logs()), 30, f"{found.pattern} logged")
    cluster.wait_isr("ledger", [0, 1, 2], 60)

    # Caught up: with the other two killed, broker 2 alone leads both partitions and serves
    # every acknowledged record.
    for broker_id in (0, 1):
        cluster.brokers[broker_id].docker.kill()
    wait_until(
        lambda: set(cluster.leaders("ledger", skip=(0, 1)).values()) == {2},
        30,
        "broker 2 leads both partitions",
    )
    acked = {p: first.acked[p] + second.acked[p] for p in range(2)}
    read = read_back(cluster.gateway.address, "ledger", 2, 60)
    verdict = compare(acked, read)
    print(f"\nfrom the recreated broker alone: {verdict}")
    assert verdict.acked == 4_000 and verdict.lost == 0, verdict


def produce_raw(address: str, value: bytes) -> log_pb2.PartitionProduceResult | grpc.RpcError:
    """One acks=1 produce straight to a broker, waiting out a pause (60 s)."""
    batch = records.encode_batch([value], timestamps=[int(time.time() * 1000)])
    request = log_pb2.ProduceRequest(
        correlation_id=1,
        acks=1,
        timeout_ms=60_000,
        partitions=[log_pb2.PartitionRecords(topic="fenced", partition=0, records=batch)],
    )
    try:
        with grpc.insecure_channel(address) as channel:
            responses = log_pb2_grpc.LogStub(channel).Produce(iter([request]), timeout=60)
            return next(iter(responses)).partitions[0]
    except grpc.RpcError as exc:
        return exc


def test_paused_leader_container_accepts_no_write_after_its_lease_ended(
    cluster: ContainerCluster,
) -> None:
    assert cluster.gateway is not None
    create_topic(cluster, "fenced", 1)
    producer = AckedProducer(cluster.gateway.address, "fenced", 1, 12_000, 12, **ACKS_ALL)
    producer.start()
    wait_until(lambda: producer.acked_count() >= 500, 60, "500 records acknowledged")
    leader = cluster.leaders("fenced")[0]
    old = cluster.brokers[leader]

    # Writes sent straight to the old leader while it is frozen: they wait in its sockets
    # and reach it only after the unpause, when its lease has long ended.
    direct: list[log_pb2.PartitionProduceResult | grpc.RpcError] = []
    old.docker.pause()
    try:
        senders = [
            threading.Thread(
                target=lambda i=i: direct.append(produce_raw(old.address, f"0:{-1 - i}".encode()))
            )
            for i in range(3)
        ]
        for sender in senders:
            sender.start()
        wait_until(
            lambda: cluster.leaders("fenced", skip=(leader,)).get(0, -1) not in (leader, -1),
            30,
            "another broker leads partition 0",
        )
        time.sleep(SESSION_TTL_S)  # well past the old lease, whatever the clocks
    finally:
        old.docker.unpause()
    # Straight after the unpause, before it could hear anything from etcd.
    direct.append(produce_raw(old.address, b"0:-9"))
    for sender in senders:
        sender.join(90)
    producer.join(180)
    assert producer.error is None, producer.error

    codes = [
        r.code().name if isinstance(r, grpc.RpcError) else common_pb2.ErrorCode.Name(r.error.code)
        for r in direct
    ]
    print(f"\nwrites to the unpaused old leader: {codes}")
    assert codes == ["NOT_LEADER_OR_FOLLOWER"] * 4, direct
    read = read_back(cluster.gateway.address, "fenced", 1, 60)
    verdict = compare(producer.acked, read)
    print(f"through the gateway meanwhile: {verdict}")
    assert verdict.lost == 0, verdict
    # Not one of the direct writes is in the log: the old leader took none as leader.
    assert not [seq for seq in read[0] if seq < 0], read[0]
