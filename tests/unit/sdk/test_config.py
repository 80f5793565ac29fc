"""Option validation happens once, at construction."""

from __future__ import annotations

import asyncio

import pytest
from tidelog import ConsumerConfig, ProducerConfig
from tidelog.compression import CompressionType
from tidelog.errors import UnsupportedCodecError

pytestmark = pytest.mark.timeout(10)


def test_producer_defaults() -> None:
    config = ProducerConfig()
    assert config.bootstrap_servers == ("127.0.0.1:9392",)
    assert config.batch_size == 256 * 1024
    assert config.acks == 1
    assert config.compression_type is CompressionType.NONE


def test_acks_all_is_minus_one_and_codecs_parse() -> None:
    config = ProducerConfig(acks="all", compression_type="zstd", bootstrap_servers="a:1, b:2")
    assert config.acks == -1
    assert config.codec is CompressionType.ZSTD
    assert config.bootstrap_servers == ("a:1", "b:2")


@pytest.mark.parametrize(
    "options",
    [
        {"acks": 2},
        {"batch_size": 0},
        {"bootstrap_servers": "nohostport"},
        {"bootstrap_servers": ""},
        {"delivery_timeout_ms": 10},
        {"max_request_size": 128 * 1024 * 1024},
    ],
)
def test_bad_producer_options_fail_early(options: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ProducerConfig(**options)  # type: ignore[arg-type]


def test_unknown_codec() -> None:
    with pytest.raises(UnsupportedCodecError):
        ProducerConfig(compression_type="brotli")


def test_consumer_window_default_and_reset_policy() -> None:
    config = ConsumerConfig()
    assert config.window_bytes == 8 * 1024 * 1024
    assert config.response_max_bytes == 8 * 1024 * 1024
    with pytest.raises(ValueError):
        ConsumerConfig(auto_offset_reset="middle")  # type: ignore[arg-type]


def test_unknown_option_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        ProducerConfig(lingerms=5)  # type: ignore[call-arg]


def test_client_id_is_checked_and_sent_with_every_call() -> None:
    from tidelog._call_metadata import CLIENT_ID_METADATA_KEY, MetadataChannel

    config = ProducerConfig(client_id="billing-7")
    assert config.security.call_metadata == ((CLIENT_ID_METADATA_KEY, "billing-7"),)
    with pytest.raises(ValueError, match="at most 255"):
        ProducerConfig(client_id="x" * 256)
    with pytest.raises(ValueError, match="printable ASCII"):
        ProducerConfig(client_id="caf\u00e9")

    async def open_one() -> None:
        channel = config.security.aio_channel("127.0.0.1:1")
        assert isinstance(channel, MetadataChannel)
        await channel.close()

    asyncio.run(open_one())


@pytest.mark.parametrize("answers", [0, 17])
def test_fetch_answers_per_message_is_checked_naming_the_limit(answers: int) -> None:
    with pytest.raises(ValueError, match="between 1 and 16"):
        ConsumerConfig(fetch_answers_per_message=answers)
