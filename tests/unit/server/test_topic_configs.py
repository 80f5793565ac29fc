"""Configs and admin requests that make no sense are refused, naming the
config (or the limit) and the range that would be accepted."""

from __future__ import annotations

import pytest
from tidelog.errors import InvalidConfigError, InvalidRequestError
from tidelog.request_limits import (
    MAX_PARTITIONS_PER_TOPIC,
    MAX_TOPICS_PER_REQUEST,
    check_create_topics,
)
from tidelog_server.topic_configs import (
    MAX_LONG,
    TOPIC_CONFIGS,
    check_replication,
    config_to_strings,
    parse_topic_configs,
    validate_topic_configs,
)

pytestmark = pytest.mark.timeout(10)

NUMERIC_KEYS = sorted(
    key
    for key in TOPIC_CONFIGS
    if key
    not in (
        "cleanup.policy",
        "message.timestamp.type",
        "compression.type",
        "unclean.leader.election.enable",
    )
)


@pytest.mark.parametrize("key", NUMERIC_KEYS)
def test_every_number_has_an_upper_bound(key: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        parse_topic_configs({key: "9" * 400})
    assert key in info.value.message and " to " in info.value.message
    with pytest.raises(InvalidConfigError) as info:
        parse_topic_configs({key: str(MAX_LONG + 1)})
    assert key in info.value.message and " to " in info.value.message


def test_int64_values_are_still_accepted_where_kafka_takes_a_long() -> None:
    config = parse_topic_configs({"retention.ms": str(MAX_LONG), "segment.ms": str(MAX_LONG)})
    assert config.retention_ms == MAX_LONG and config.segment_ms == MAX_LONG


def test_index_interval_of_zero_bytes_is_refused() -> None:
    with pytest.raises(InvalidConfigError) as info:
        validate_topic_configs({"index.interval.bytes": "0"})
    assert "index.interval.bytes=0" in info.value.message and "use 1 to" in info.value.message


def test_min_insync_replicas_above_the_replication_factor_is_refused() -> None:
    config = parse_topic_configs({"min.insync.replicas": "3"})
    check_replication(config, 3, "orders")
    with pytest.raises(InvalidConfigError) as info:
        check_replication(config, 2, "orders")
    message = info.value.message
    assert "min.insync.replicas=3" in message and "replication factor 2" in message
    assert "use 1 to 2" in message


def test_create_topics_limits_name_themselves() -> None:
    check_create_topics([("t", 1)] * MAX_TOPICS_PER_REQUEST)
    with pytest.raises(InvalidRequestError) as info:
        check_create_topics([("t", 1)] * (MAX_TOPICS_PER_REQUEST + 1))
    assert "MAX_TOPICS_PER_REQUEST" in info.value.message
    check_create_topics([("t", MAX_PARTITIONS_PER_TOPIC)])
    with pytest.raises(InvalidRequestError) as info:
        check_create_topics([("t", MAX_PARTITIONS_PER_TOPIC + 1)])
    assert "MAX_PARTITIONS_PER_TOPIC" in info.value.message


def test_new_topic_configs_parse_and_print() -> None:
    config = parse_topic_configs(
        {
            "cleanup.policy": "delete,compact",
            "delete.retention.ms": "1000",
            "min.cleanable.dirty.ratio": "0.25",
            "min.compaction.lag.ms": "5",
            "compression.type": "snappy",
        }
    )
    assert config.compact and config.delete
    assert config_to_strings(config)["min.cleanable.dirty.ratio"] == "0.25"
    assert config_to_strings(config)["compression.type"] == "snappy"
    with pytest.raises(InvalidConfigError, match=r"compression\.type='brotli'.*producer, none"):
        parse_topic_configs({"compression.type": "brotli"})
    with pytest.raises(InvalidConfigError, match=r"delete\.retention\.ms=-1 is out of range"):
        parse_topic_configs({"delete.retention.ms": "-1"})
