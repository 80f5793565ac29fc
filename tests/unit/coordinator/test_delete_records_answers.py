"""The coordinator's DeleteRecords takes each leader's answer entry by entry:
one it did not get (a short or reordered answer) is a retriable error, never
an empty result that reads as a success."""

from __future__ import annotations

from tidelog.v1 import admin_pb2, common_pb2
from tidelog_coordinator.broker_calls import fill_from_leader


def _asked(*partitions: int) -> list[admin_pb2.DeleteRecordsResult]:
    return [admin_pb2.DeleteRecordsResult(topic="t", partition=p) for p in partitions]


def _answer(*entries: tuple[int, int]) -> admin_pb2.DeleteRecordsResponse:
    return admin_pb2.DeleteRecordsResponse(
        partitions=[
            admin_pb2.DeleteRecordsResult(topic="t", partition=p, low_watermark=low)
            for p, low in entries
        ]
    )


def test_a_full_answer_fills_each_entry_it_was_asked_about() -> None:
    results = _asked(0, 1, 2)
    fill_from_leader(results, [0, 2], _answer((0, 5), (2, 7)), leader=1)
    assert [(r.partition, r.low_watermark, r.error.code) for r in results] == [
        (0, 5, common_pb2.NONE),
        (1, 0, common_pb2.NONE),  # another leader's entry: untouched here
        (2, 7, common_pb2.NONE),
    ]


def test_an_entry_a_short_answer_lacks_is_a_retriable_error() -> None:
    results = _asked(0, 1)
    fill_from_leader(results, [0, 1], _answer((0, 5)), leader=3)
    assert (results[0].low_watermark, results[0].error.code) == (5, common_pb2.NONE)
    assert results[1].error.code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert "leader 3 answered without t-1" in results[1].error.message


def test_an_answer_for_another_partition_is_not_taken_for_the_one_asked() -> None:
    results = _asked(0, 1)
    fill_from_leader(results, [0, 1], _answer((1, 9), (0, 5)), leader=2)
    assert all(r.error.code == common_pb2.NOT_LEADER_OR_FOLLOWER for r in results)
    assert all(r.low_watermark == 0 for r in results)
