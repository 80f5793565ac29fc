"""Per-log configuration: the shared topic-config table, seen by the storage.

The table of topic configs (Kafka's names, types, ranges, defaults and the
validation messages) lives once, in the server core's
`tidelog_server.topic_configs`, because the coordinator and the brokers must
agree on it. The
storage engine calls the effective settings of one partition log a
`LogConfig`; it is the same type.
"""

from __future__ import annotations

from tidelog_server.topic_configs import (
    TOPIC_CONFIGS,
    config_to_strings,
    parse_topic_configs,
)
from tidelog_server.topic_configs import TopicConfig as LogConfig

__all__ = ["TOPIC_CONFIGS", "LogConfig", "config_to_strings", "parse_topic_configs"]
