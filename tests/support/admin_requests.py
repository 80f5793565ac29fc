"""Admin requests built for tests: one entry per topic name (or partition), in order."""

from __future__ import annotations

from tidelog.v1 import admin_pb2

#: What `topic_request` sets in an AlterConfigs entry.
ALTERED_RETENTION_MS = "1000"


def topic_request(rpc: str, names: list[str]) -> object:
    """A CreateTopics (one partition, one replica each), DeleteTopics,
    AlterConfigs (retention.ms=ALTERED_RETENTION_MS) or CreatePartitions (to
    two) request naming `names`."""
    if rpc == "CreateTopics":
        return admin_pb2.CreateTopicsRequest(
            topics=[admin_pb2.NewTopic(name=n, partitions=1, replication_factor=1) for n in names]
        )
    if rpc == "DeleteTopics":
        return admin_pb2.DeleteTopicsRequest(names=names)
    if rpc == "AlterConfigs":
        return admin_pb2.AlterConfigsRequest(
            topics=[
                admin_pb2.AlterTopicConfigs(name=n, set={"retention.ms": ALTERED_RETENTION_MS})
                for n in names
            ]
        )
    if rpc == "CreatePartitions":
        return admin_pb2.CreatePartitionsRequest(
            topics=[admin_pb2.NewPartitions(name=n, total_count=2) for n in names]
        )
    raise ValueError(f"no topic request for {rpc}")


def delete_records_request(topic: str, offsets: list[tuple[int, int]]) -> object:
    """A DeleteRecords request of (partition, offset) entries of `topic`, in order."""
    return admin_pb2.DeleteRecordsRequest(
        partitions=[
            admin_pb2.DeleteRecordsPartition(topic=topic, partition=p, offset=o) for p, o in offsets
        ]
    )
