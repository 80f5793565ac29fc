"""The broker's opt-in looks inside batches (compression.type, keyless records
in compacted topics) and the config keys of issue 3 (topic and broker)."""

from __future__ import annotations

import pytest
from tidelog.compression import CompressionType
from tidelog.errors import InvalidConfigError, InvalidRecordError
from tidelog.records import decode_batches, encode_batch, iter_batches
from tidelog_broker import record_policy
from tidelog_broker.config import BrokerConfig, build_config
from tidelog_server.topic_configs import config_to_strings, parse_topic_configs


def _batches(*encoded: bytes) -> tuple[bytearray, list]:
    buf = bytearray(b"".join(encoded))
    return buf, list(iter_batches(buf))


def test_recompress_keeps_every_field_and_copies_matching_batches() -> None:
    plain = encode_batch(
        [b"a", None, b"c"],
        keys=[b"1", b"2", None],
        timestamps=[10, 12, 11],
        headers=[[("h", b"x")], None, [("n", None)]],
        offset_deltas=[0, 2, 5],
        producer_id=9,
        producer_epoch=2,
        base_sequence=40,
    )
    already = encode_batch([b"z"], codec=CompressionType.LZ4)
    buf, batches = _batches(plain, already)
    assert record_policy.needs_recompression(batches, CompressionType.LZ4)
    out = record_policy.recompress(buf, batches, CompressionType.LZ4)
    first, _ = decode_batches(out)
    original = next(decode_batches(plain))
    assert first.header.compression == CompressionType.LZ4
    for field in ("offsets", "timestamps", "keys", "values"):
        assert getattr(first, field) == getattr(original, field)
    assert first.headers == [[("h", b"x")], [], [("n", None)]]
    h = first.header
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.record_count) == (9, 2, 40, 3)
    assert h.last_offset_delta == 5
    assert bytes(out[len(out) - len(already) :]) == already
    _, lz4_only = _batches(already)
    assert not record_policy.needs_recompression(lz4_only, CompressionType.LZ4)


def test_keyless_records_are_refused() -> None:
    buf, batches = _batches(
        encode_batch([b"v"], keys=[b"k"]), encode_batch([b"v", b"w"], keys=[b"k", None])
    )
    with pytest.raises(InvalidRecordError, match="cannot accept message without key"):
        record_policy.reject_null_keys(buf, batches, "t")
    buf, batches = _batches(encode_batch([b"v"], keys=[b"k"], codec=CompressionType.GZIP))
    record_policy.reject_null_keys(buf, batches, "t")


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
