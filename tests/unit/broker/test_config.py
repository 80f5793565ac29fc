"""The broker's config keys (config.build_config): the cleaner and retention
keys and the cluster-wide log defaults."""

from __future__ import annotations

import pytest
from tidelog.errors import InvalidConfigError
from tidelog_broker.config import BrokerConfig, build_config


def test_broker_keys_and_cluster_defaults() -> None:
    config = build_config(
        BrokerConfig(),
        {
            "log.retention.check.interval.ms": "250",
            "log.cleaner.dedupe.buffer.size": "1048576",
            "log.cleaner.backoff.ms": "50",
            "log.cleaner.enable": "false",
            "log.retention.ms": "1000",
            "log.cleanup.policy": "compact",
        },
    )
    assert config.retention_check_interval_ms == 250
    assert config.cleaner_dedupe_buffer_bytes == 1 << 20
    assert (config.cleaner_backoff_ms, config.cleaner_enable) == (50, False)
    assert config.log_defaults.retention_ms == 1000
    assert config.log_defaults.cleanup_policy == "compact"
    with pytest.raises(InvalidConfigError, match=r"log\.cleaner\.backoff\.ms=0 is out of range"):
        build_config(BrokerConfig(), {"log.cleaner.backoff.ms": "0"})
