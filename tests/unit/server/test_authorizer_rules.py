"""Every RPC of every service has a deliberate authorization rule."""

from __future__ import annotations

import pytest
from google.protobuf import message_factory
from tidelog.v1 import admin_pb2, cluster_pb2, group_pb2, log_pb2, records_pb2
from tidelog_server.authorizer import RULES
from tidelog_server.internal import replica_pb2

METHODS = [
    (f"/{service.full_name}/{method.name}", method)
    for module in (admin_pb2, cluster_pb2, group_pb2, log_pb2, records_pb2, replica_pb2)
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]


@pytest.mark.parametrize(("path", "method"), METHODS, ids=[p for p, _ in METHODS])
def test_each_rpc_has_a_rule_that_reads_its_request(path: str, method: object) -> None:
    assert path in RULES, f"{path} has no rule in tidelog_server.authorizer.RULES"
    request = message_factory.GetMessageClass(method.input_type)()  # type: ignore[attr-defined]
    # The rule's field names exist (an empty request names nothing, or the cluster).
    for operation, resource_type, _ in RULES[path].checks(request, {}):
        assert resource_type == "cluster", (path, operation)


def test_the_main_mappings_are_kafkas() -> None:
    produce = log_pb2.ProduceRequest(partitions=[log_pb2.PartitionRecords(topic="t")])
    assert RULES["/tidelog.v1.Log/Produce"].checks(produce, {}) == [("Write", "topic", "t")]
    fetch = log_pb2.FetchRequest(positions=[log_pb2.FetchPosition(topic="t")])
    assert RULES["/tidelog.v1.Log/Fetch"].checks(fetch, {}) == [("Read", "topic", "t")]
    commit = group_pb2.CommitOffsetsRequest(
        group_id="g", offsets=[group_pb2.OffsetCommit(topic="t")]
    )
    assert RULES["/tidelog.v1.Group/CommitOffsets"].checks(commit, {}) == [
        ("Read", "group", "g"),
        ("Read", "topic", "t"),
    ]
    # Each commit of a commit stream's message is checked as one CommitOffsets.
    other = group_pb2.CommitOffsetsRequest(
        group_id="h", offsets=[group_pb2.OffsetCommit(topic="u")]
    )
    streamed = group_pb2.CommitOffsetsStreamRequest(
        commits=[
            group_pb2.StreamedCommit(correlation_id=7, commit=commit),
            group_pb2.StreamedCommit(correlation_id=8, commit=other),
        ]
    )
    assert RULES["/tidelog.v1.Group/CommitOffsetsStream"].checks(streamed, {}) == [
        ("Read", "group", "g"),
        ("Read", "topic", "t"),
        ("Read", "group", "h"),
        ("Read", "topic", "u"),
    ]
