"""A backlog for the gateway's memory tests: `partitions` partitions of
`topic`, each `batches` batches of `records_per_batch` records of `value`,
written through the batch-level Log.Produce of `address` (acks=1) so that
writing it costs the test nothing per record."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import grpc
from tidelog import AdminClient, NewTopic, records
from tidelog.v1 import common_pb2, log_pb2, log_pb2_grpc

#: Errors a new topic's partitions answer until their brokers host them
#: (brokers pick a new topic up from etcd after create_topics returns, as
#: Kafka's do from the controller): a producer retries them.
NOT_HOSTED_YET = (common_pb2.UNKNOWN_TOPIC_OR_PARTITION, common_pb2.NOT_LEADER_OR_FOLLOWER)


def write_backlog(
    address: str, topic: str, partitions: int, batches: int, records_per_batch: int, value: bytes
) -> None:
    with AdminClient(address) as admin:
        admin.create_topics([NewTopic(topic, partitions)])
    batch = records.encode_batch([value] * records_per_batch)

    def request(n: int, to: Iterable[int]) -> log_pb2.ProduceRequest:
        return log_pb2.ProduceRequest(
            correlation_id=n,
            acks=1,
            partitions=[
                log_pb2.PartitionRecords(topic=topic, partition=p, records=batch) for p in to
            ],
        )

    with grpc.insecure_channel(address) as channel:
        stub = log_pb2_grpc.LogStub(channel)
        # The first batch of each partition, retried until its broker hosts it.
        waiting = set(range(partitions))
        deadline = time.monotonic() + 60
        while waiting:
            assert time.monotonic() < deadline, f"{topic} partitions {waiting} take no writes"
            (response,) = stub.Produce(iter([request(0, sorted(waiting))]), timeout=30)
            for result in response.partitions:
                if not result.HasField("error"):
                    waiting.discard(result.partition)
                else:
                    assert result.error.code in NOT_HOSTED_YET, result
            if waiting:
                time.sleep(0.1)

        def requests() -> Iterator[log_pb2.ProduceRequest]:
            for n in range(1, batches):
                yield request(n, range(partitions))

        for response in stub.Produce(requests(), timeout=120):
            for result in response.partitions:
                assert not result.HasField("error"), result
