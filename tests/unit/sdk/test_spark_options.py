"""The Spark source's option parsing (Kafka source's names, errors naming the
option), its offset JSON, and the planning of ranges (minPartitions) and
rate limits (maxOffsetsPerTrigger). No Spark session needed."""

from __future__ import annotations

import json

import pytest
from tidelog.spark import offsets as offs
from tidelog.spark.options import EARLIEST, LATEST, SourceOptionError, parse


class CaseInsensitive(dict):
    """What Spark hands a data source: lookups ignore case, keys come back lower-cased."""

    def __init__(self, items: dict[str, str]) -> None:
        super().__init__({k.lower(): v for k, v in items.items()})

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        return super().get(key.lower(), default)


def test_kafka_names_and_defaults() -> None:
    options = parse(
        CaseInsensitive(
            {
                "kafka.bootstrap.servers": "127.0.0.1:1",
                "subscribe": "a, b,a",
                "maxOffsetsPerTrigger": "10",
                "includeHeaders": "TRUE",
            }
        ),
        streaming=True,
    )
    assert options.servers == "127.0.0.1:1"
    assert options.topics == ("a", "b")
    assert options.starting.kind == "latest"
    assert (options.max_offsets_per_trigger, options.include_headers) == (10, True)
    assert options.fail_on_data_loss is True
    batch = parse({"subscribePattern": "t-.*"}, streaming=False)
    assert (batch.starting.kind, batch.ending.kind, batch.servers) == ("earliest", "latest", None)
    assert batch.matches("t-1") and not batch.matches("xt-1")


def test_json_offsets_and_assign() -> None:
    options = parse(
        {
            "assign": '{"t":[0,1],"u":[2]}',
            "startingOffsets": '{"t":{"0":5,"1":-2},"u":{"2":-1}}',
        },
        streaming=True,
    )
    assert options.assigned == (("t", 0), ("t", 1), ("u", 2))
    assert options.starting.offsets == {("t", 0): 5, ("t", 1): EARLIEST, ("u", 2): LATEST}


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"subscribe": "t", "bogus": "1"}, "unknown option 'bogus'"),
        ({"subscribe": "t", "assign": '{"t":[0]}'}, "'subscribe' and 'assign'"),
        ({}, "'subscribe', 'subscribePattern' or 'assign'"),
        ({"subscribe": " , "}, "option 'subscribe' names no topic"),
        ({"subscribePattern": "("}, "'subscribePattern' is not a valid regular expression"),
        ({"subscribePattern": "a" * 1001}, "longer than 1000"),
        ({"assign": '{"t":[-1]}'}, "partition -1 of 't' is negative"),
        ({"subscribe": "t", "startingOffsets": "{"}, "'startingOffsets' is not valid JSON"),
        ({"subscribe": "t", "startingOffsets": '{"t":{"0":-5}}'}, "'startingOffsets': t-0"),
        ({"subscribe": "t", "startingOffsets": '{"t":{"x":1}}'}, "partition 'x'"),
        ({"subscribe": "t", "startingTimestamp": "-4"}, "'startingTimestamp'"),
        (
            {"subscribe": "t", "startingTimestamp": "1", "startingOffsets": "earliest"},
            "cannot be combined",
        ),
        ({"subscribe": "t", "minPartitions": "x"}, "'minPartitions' must be a positive integer"),
        ({"subscribe": "t", "includeHeaders": "yes"}, "'includeHeaders' must be"),
        ({"subscribe": "t", "endingOffsets": "latest"}, "'endingOffsets' is for batch"),
        (
            {
                "subscribe": "t",
                "tidelog.bootstrap.servers": "a:1",
                "kafka.bootstrap.servers": "b:1",
            },
            "alias 'kafka.bootstrap.servers'",
        ),
    ],
)
def test_bad_stream_options_name_the_option(given: dict[str, str], named: str) -> None:
    with pytest.raises(SourceOptionError) as caught:
        parse(given, streaming=True)
    assert named in str(caught.value)


def test_batch_only_rules() -> None:
    with pytest.raises(SourceOptionError, match="'endingOffsets' cannot be 'earliest'"):
        parse({"subscribe": "t", "endingOffsets": "earliest"}, streaming=False)
    with pytest.raises(SourceOptionError, match="'endingOffsets': t-0 has -2"):
        parse({"subscribe": "t", "endingOffsets": '{"t":{"0":-2}}'}, streaming=False)
    with pytest.raises(SourceOptionError, match="'maxOffsetsPerTrigger' is for streams"):
        parse({"subscribe": "t", "maxOffsetsPerTrigger": "3"}, streaming=False)


def test_offsets_json_is_sorted_whatever_the_order_given() -> None:
    a = offs.to_json({("b", 10): 1, ("a", 2): 5, ("b", 2): 3})
    b = offs.to_json({("b", 2): 3, ("a", 2): 5, ("b", 10): 1})
    # Spark compares offsets as JSON strings.
    assert json.dumps(a) == json.dumps(b) == '{"a": {"2": 5}, "b": {"2": 3, "10": 1}}'
    assert offs.from_json(json.loads(json.dumps(a))) == {("a", 2): 5, ("b", 2): 3, ("b", 10): 1}


def test_min_partitions_splits_ranges_in_proportion() -> None:
    ranges = [offs.OffsetRange("t", 0, 0, 100), offs.OffsetRange("t", 1, 10, 40)]
    assert offs.plan_ranges(ranges, None) == ranges
    assert offs.plan_ranges(ranges, 2) == ranges
    planned = offs.plan_ranges(ranges, 4)
    assert [(r.partition, r.start, r.end) for r in planned] == [
        (0, 0, 33), (0, 33, 66), (0, 66, 100), (1, 10, 40),
    ]  # fmt: skip
    # Every offset once, none lost, whatever the split.
    for parts in range(1, 50):
        covered = [
            (r.partition, o) for r in offs.plan_ranges(ranges, parts) for o in range(r.start, r.end)
        ]
        assert sorted(covered) == [(0, o) for o in range(100)] + [(1, o) for o in range(10, 40)]
    assert offs.plan_ranges([offs.OffsetRange("t", 0, 5, 5)], 3) == []


def test_rate_limit_shares_in_proportion_to_backlog() -> None:
    start = {("t", 0): 0, ("t", 1): 100}
    latest = {("t", 0): 300, ("t", 1): 200}
    assert offs.rate_limit(start, latest, 1000) == latest
    limited = offs.rate_limit(start, latest, 40)
    assert limited == {("t", 0): 30, ("t", 1): 110}
    # A partition not in start (new) is not read past its latest; tiny shares round up.
    assert offs.rate_limit({("t", 0): 0}, {("t", 0): 10_000, ("t", 1): 1}, 10)[("t", 1)] == 1
