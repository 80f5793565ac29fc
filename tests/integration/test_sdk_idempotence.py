"""The idempotent producer against a real standalone broker: producer ids,
duplicates answered with their original offsets, sequence gaps and fenced
epochs refused, producer state kept across restarts and crashes, and a
producer that loses its broker mid-stream storing every record exactly once."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from typing import Any

import grpc
import pytest
from tidelog import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tidelog._sender import Sender
from tidelog.errors import InvalidProducerEpochError
from tidelog.records import encode_batch, read_header
from tidelog.v1 import cluster_pb2, cluster_pb2_grpc, common_pb2, log_pb2, log_pb2_grpc

from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.timeout(40)


def create(address: str, name: str, partitions: int = 1) -> None:
    with AdminClient(address) as admin:
        admin.create_topics([NewTopic(name, num_partitions=partitions)])


def init_producer_id(address: str, key: str = "") -> tuple[int, int]:
    with grpc.insecure_channel(address) as channel:
        reply = cluster_pb2_grpc.ClusterStub(channel).InitProducerId(
            cluster_pb2.InitProducerIdRequest(producer_key=key), timeout=10
        )
    return reply.producer_id, reply.producer_epoch


def idempotent_batch(pid: int, epoch: int, seq: int, count: int = 3) -> bytes:
    return encode_batch(
        [b"%d-%d" % (seq, i) for i in range(count)],
        base_timestamp=1_000,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def produce_raw(address: str, topic: str, data: bytes) -> log_pb2.PartitionProduceResult:
    with grpc.insecure_channel(address) as channel:
        stub = log_pb2_grpc.LogStub(channel)
        request = log_pb2.ProduceRequest(
            correlation_id=1,
            acks=-1,
            partitions=[log_pb2.PartitionRecords(topic=topic, partition=0, records=data)],
        )
        (response,) = list(stub.Produce(iter([request]), timeout=10))
    return response.partitions[0]


def code_name(result: log_pb2.PartitionProduceResult) -> str:
    return common_pb2.ErrorCode.Name(result.error.code)


def test_standalone_broker_allocates_producer_ids(broker: BrokerProcess) -> None:
    first, epoch = init_producer_id(broker.address)
    second, _ = init_producer_id(broker.address)
    assert epoch == 0 and second > first >= 0
    keyed, keyed_epoch = init_producer_id(broker.address, "orders-writer")
    assert init_producer_id(broker.address, "orders-writer") == (keyed, keyed_epoch + 1)


def test_raw_duplicates_gaps_and_fenced_epochs(broker: BrokerProcess, topic_name: str) -> None:
    create(broker.address, topic_name)
    # Keyed: a second InitProducerId with the key hands out epoch + 1.
    pid, epoch = init_producer_id(broker.address, f"{topic_name}-raw")
    first = produce_raw(broker.address, topic_name, idempotent_batch(pid, epoch, 0))
    assert code_name(first) == "NONE" and first.base_offset == 0
    second = produce_raw(broker.address, topic_name, idempotent_batch(pid, epoch, 3))
    assert second.base_offset == 3
    # The same batch again (a retry): success, with the original offset.
    again = produce_raw(broker.address, topic_name, idempotent_batch(pid, epoch, 0))
    assert code_name(again) == "NONE" and again.base_offset == 0
    gap = produce_raw(broker.address, topic_name, idempotent_batch(pid, epoch, 9))
    assert code_name(gap) == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    assert "expected 6" in gap.error.message
    # A newer epoch takes over (from sequence 0); the older one is fenced.
    assert init_producer_id(broker.address, f"{topic_name}-raw") == (pid, epoch + 1)
    took_over = produce_raw(broker.address, topic_name, idempotent_batch(pid, epoch + 1, 0))
    assert code_name(took_over) == "NONE"
    fenced = produce_raw(broker.address, topic_name, idempotent_batch(pid, epoch, 6))
    assert code_name(fenced) == "INVALID_PRODUCER_EPOCH"
    with Consumer(bootstrap_servers=broker.address) as consumer:
        assert consumer.end_offsets([TopicPartition(topic_name, 0)]) == {
            TopicPartition(topic_name, 0): 9
        }


def test_producer_state_survives_restart_and_crash(own_broker: BrokerProcess) -> None:
    topic = "restarts"
    create(own_broker.address, topic)
    pid, epoch = init_producer_id(own_broker.address)
    for seq in range(0, 30, 3):
        produce_raw(own_broker.address, topic, idempotent_batch(pid, epoch, seq))
    own_broker.restart()  # clean: state from the snapshot written at close
    assert (
        produce_raw(own_broker.address, topic, idempotent_batch(pid, epoch, 27)).base_offset == 27
    )
    assert (
        produce_raw(own_broker.address, topic, idempotent_batch(pid, epoch, 30)).base_offset == 30
    )
    own_broker.kill()  # crash: state from the snapshot plus the headers after it
    own_broker.spawn()
    assert (
        produce_raw(own_broker.address, topic, idempotent_batch(pid, epoch, 30)).base_offset == 30
    )
    assert (
        produce_raw(own_broker.address, topic, idempotent_batch(pid, epoch, 33)).base_offset == 33
    )
    # The counter file survives too: ids are never handed out twice.
    assert init_producer_id(own_broker.address)[0] > pid


class FailedRequests:
    """Spies on the producer's sender (the real one runs unchanged): the
    requests sent whose answer never came, which the sender retries."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.errors: Counter[str] = Counter()
        original = Sender.on_request_failed
        spy = self

        def on_request_failed(sender: Sender, entry: Any, error: Any) -> None:
            spy.errors[type(error).__name__] += sum(len(g) for g in entry.batches.values())
            original(sender, entry, error)

        monkeypatch.setattr(Sender, "on_request_failed", on_request_failed)


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_broker_fault_mid_stream_stores_every_record_once(
    own_broker: BrokerProcess, fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill: SIGKILL and restart (in-flight requests are lost, state is
    rebuilt from the log). pause: SIGSTOP longer than request_timeout_ms, so
    the producer gives up on requests the broker then appends after SIGCONT
    and retries them; without idempotence this stores hundreds of records
    twice (measured: 500 of 30,000). Either way the test checks that
    requests really were lost and retried: without a retry it proves nothing."""
    failed_requests = FailedRequests(monkeypatch)
    topic = "exactly-once"
    partitions = 2
    count = 30_000
    create(own_broker.address, topic, partitions)
    sent: list[object] = []
    errors: list[BaseException] = []
    with Producer(
        own_broker.address,
        acks="all",
        linger_ms=1,
        batch_size=16 * 1024,
        retry_backoff_ms=20,
        delivery_timeout_ms=30_000,
        request_timeout_ms=500 if fault == "pause" else 5_000,
    ) as producer:

        def send_all() -> None:
            try:
                for i in range(count):
                    sent.append(producer.send(topic, b"%08d" % i, partition=i % partitions))
                    if i % 500 == 0:
                        time.sleep(0.005)  # spread the sends over the crash
            except BaseException as exc:
                errors.append(exc)

        sender = threading.Thread(target=send_all)
        sender.start()
        while len(sent) < count // 3:
            time.sleep(0.01)
        if fault == "kill":
            own_broker.kill()
            time.sleep(0.3)
            own_broker.spawn()
        else:
            os.kill(own_broker.pid, signal.SIGSTOP)
            time.sleep(1.5)
            os.kill(own_broker.pid, signal.SIGCONT)
        sender.join(30)
        producer.flush(30)
    assert not errors
    failed = [f for f in sent if f.failed()]  # type: ignore[attr-defined]
    assert not failed, failed[0].exception()  # type: ignore[attr-defined]
    values: Counter[bytes | None] = Counter()
    with Consumer(bootstrap_servers=own_broker.address, consumer_timeout_ms=2_000) as consumer:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + 20
        while sum(consumer.position(tp) for tp in tps) < sum(ends.values()):
            assert time.monotonic() < deadline
            for records in consumer.poll(timeout_ms=500).values():
                values.update(r.value for r in records)
    duplicates = {v: n for v, n in values.items() if n > 1}
    print(
        f"{fault}: read back {len(values)} distinct of {count} sent, {len(duplicates)} twice; "
        f"batches of unanswered requests retried: {dict(failed_requests.errors)}"
    )
    # Every future succeeded, so each batch of a failed request was sent again.
    assert failed_requests.errors, "no request was lost: the fault missed the stream"
    if fault == "pause":
        assert failed_requests.errors["RequestTimedOutError"] > 0, failed_requests.errors
    assert not duplicates
    assert len(values) == count
    assert sum(ends.values()) == count


def test_a_second_producer_with_the_same_key_fences_the_first(
    broker: BrokerProcess, topic_name: str
) -> None:
    create(broker.address, topic_name)
    options = {"acks": "all", "producer_key": f"{topic_name}-writer", "linger_ms": 0}
    with Producer(broker.address, **options) as old:
        assert old.send(topic_name, b"from old").get(10).offset == 0
        with Producer(broker.address, **options) as new:
            assert new.send(topic_name, b"from new").get(10).offset == 1
        with pytest.raises(InvalidProducerEpochError, match="fenced"):
            old.send(topic_name, b"old again").get(10)
        # Every later send fails the same way.
        with pytest.raises(InvalidProducerEpochError):
            old.send(topic_name, b"and again").get(10)


def test_another_producers_id_with_epoch_plus_one_is_refused_and_fences_nobody(
    own_broker: BrokerProcess, topic_name: str
) -> None:
    # Issue 16 item 5: epochs move only through InitProducerId.
    address = own_broker.address
    create(address, topic_name)
    options = {"acks": "all", "linger_ms": 0, "retry_backoff_ms": 50}
    with Producer(address, **options) as real:
        assert real.send(topic_name, b"r0", partition=0).get(10).offset == 0
        # What another client could learn (a fetch returns batch headers) or guess.
        log_file = own_broker.data_dir / f"{topic_name}-0" / f"{0:020d}.log"
        stored = read_header(log_file.read_bytes())
        pid, epoch = stored.producer_id, stored.producer_epoch
        assert pid >= 0 and epoch >= 0
        for forged_epoch in (epoch + 1, 32_767):
            forged = produce_raw(address, topic_name, idempotent_batch(pid, forged_epoch, 0))
            assert code_name(forged) == "INVALID_PRODUCER_EPOCH", forged
            assert f"epoch {forged_epoch} was never handed out" in forged.error.message
        # The real producer carries on, and its records are all there.
        assert real.send(topic_name, b"r1", partition=0).get(10).offset == 1
        # A keyed producer's next epoch is accepted only once handed out.
        kpid, kepoch = init_producer_id(address, f"{topic_name}-k")
        early = produce_raw(address, topic_name, idempotent_batch(kpid, kepoch + 1, 0))
        assert code_name(early) == "INVALID_PRODUCER_EPOCH"
        assert init_producer_id(address, f"{topic_name}-k") == (kpid, kepoch + 1)
        granted = produce_raw(address, topic_name, idempotent_batch(kpid, kepoch + 1, 0))
        assert code_name(granted) == "NONE"
        # Still refused after a restart (the allocator's file is the authority).
        own_broker.restart()
        again = produce_raw(address, topic_name, idempotent_batch(pid, epoch + 1, 0))
        assert code_name(again) == "INVALID_PRODUCER_EPOCH"
        assert real.send(topic_name, b"r2", partition=0).get(20).offset == 5
