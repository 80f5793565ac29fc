"""The fuzzer itself: its cases replay from (seed, index) and cover every
method, every kind of case and every lie a batch header can tell."""

from __future__ import annotations

from collections import Counter

import grpc
from tidelog.errors import ERROR_CODE_METADATA_KEY
from tidelog.v1 import admin_pb2, cluster_pb2, common_pb2, group_pb2, log_pb2, records_pb2
from tidelog_server.internal import replica_pb2

from tests.security.fuzz_sending import judge
from tests.security.fuzzing import Case, Fuzzer, targets_of

MODULES = [log_pb2, admin_pb2, group_pb2, cluster_pb2, records_pb2, replica_pb2]


def test_a_case_is_the_same_whenever_it_is_built() -> None:
    targets = targets_of(MODULES)
    first = list(Fuzzer(7, targets, names=["t"]).cases(3000))
    again = Fuzzer(7, targets, names=["t"])
    assert [again.case(c.index) for c in reversed(first)] == list(reversed(first))
    assert list(Fuzzer(8, targets, names=["t"]).cases(50)) != first[:50]


def test_ten_thousand_cases_reach_every_method_with_every_kind() -> None:
    targets = targets_of(MODULES)
    cases = list(Fuzzer(1, targets, names=["t"]).cases(10_000))
    methods = Counter(c.target.path for c in cases)
    assert set(methods) == {t.path for t in targets}
    assert "/tidelog.v1.Log/Produce" in methods
    assert "/tidelog.internal.Replica/ReplicaFetch" in methods
    assert {c.kind for c in cases} == {"message", "damaged", "random", "empty"}
    assert min(methods.values()) >= 100


def _case_for(path: str) -> Case:
    target = next(t for t in targets_of(MODULES) if t.path == path)
    return Case(0, target, "message", (b"",))


def test_the_judge_flags_what_only_a_bug_produces() -> None:
    produce = _case_for("/tidelog.v1.Log/Produce")
    buggy = log_pb2.ProduceResponse(
        partitions=[
            log_pb2.PartitionProduceResult(
                topic="t", error=common_pb2.Error(code=common_pb2.UNKNOWN_SERVER_ERROR)
            )
        ]
    ).SerializeToString()
    typed = log_pb2.ProduceResponse(
        partitions=[
            log_pb2.PartitionProduceResult(
                topic="t", error=common_pb2.Error(code=common_pb2.CORRUPT_MESSAGE)
            )
        ]
    ).SerializeToString()
    ok = grpc.StatusCode.OK
    assert judge(produce, ok, "", (), [buggy]) is not None
    assert judge(produce, ok, "", (), [typed]) is None
    assert judge(produce, grpc.StatusCode.UNKNOWN, "Exception iterating responses", (), [])
    assert judge(produce, grpc.StatusCode.INVALID_ARGUMENT, "x", (), []) is None
    trailers = ((ERROR_CODE_METADATA_KEY, "UNKNOWN_SERVER_ERROR"),)
    assert judge(produce, grpc.StatusCode.INTERNAL, "boom", trailers, []) is not None
    # grpc's own answer to bytes that are not a request.
    decode_error = "Unexpected <class 'google.protobuf.message.DecodeError'>: Error parsing"
    assert judge(produce, grpc.StatusCode.UNKNOWN, decode_error, (), []) is None
