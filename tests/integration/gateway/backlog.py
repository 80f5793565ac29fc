"""A backlog for the gateway's memory tests: `partitions` partitions of
`topic`, each `batches` batches of `records_per_batch` records of `value`,
written through the batch-level Log.Produce of `address` (acks=1) so that
writing it costs the test nothing per record."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from tidelog import AdminClient, NewTopic, records
from tidelog.v1 import log_pb2, log_pb2_grpc


def write_backlog(
    address: str, topic: str, partitions: int, batches: int, records_per_batch: int, value: bytes
) -> None:
    with AdminClient(address) as admin:
        admin.create_topics([NewTopic(topic, partitions)])
    batch = records.encode_batch([value] * records_per_batch)

    def requests() -> Iterator[log_pb2.ProduceRequest]:
        for n in range(batches):
            yield log_pb2.ProduceRequest(
                correlation_id=n,
                acks=1,
                partitions=[
                    log_pb2.PartitionRecords(topic=topic, partition=p, records=batch)
                    for p in range(partitions)
                ],
            )

    with grpc.insecure_channel(address) as channel:
        for response in log_pb2_grpc.LogStub(channel).Produce(requests(), timeout=120):
            for result in response.partitions:
                assert not result.HasField("error"), result
