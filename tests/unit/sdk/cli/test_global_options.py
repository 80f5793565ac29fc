"""The CLI's global options (before or after the subcommand), --version,
client properties with Kafka's names, and the documented exit codes."""

from __future__ import annotations

import argparse

import grpc
import pytest
from tidelog.cli import main
from tidelog.cli._common import (
    EXIT_AUTH,
    EXIT_CODES_HELP,
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    client_properties,
    exit_code_for,
    split_global_options,
)
from tidelog.config import ConsumerConfig, ProducerConfig
from tidelog.errors import (
    BrokerNotAvailableError,
    GroupIdNotFoundError,
    InvalidConfigError,
    InvalidTopicError,
    NonEmptyGroupError,
    NotEnoughReplicasAfterAppendError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)


@pytest.mark.parametrize(
    "argv",
    [
        ["--bootstrap-server", "h:1", "topics", "list"],
        ["topics", "list", "--bootstrap-server", "h:1"],
        ["topics", "--bootstrap-server=h:1", "list"],
        ["-b", "h:1", "consume", "t"],
    ],
)
def test_global_options_are_taken_wherever_they_stand(argv: list[str]) -> None:
    found, rest = split_global_options(argv)
    assert found == {"bootstrap_server": "h:1"}
    assert "h:1" not in rest and "--bootstrap-server" not in rest


def test_a_bad_global_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="host:port"):
        split_global_options(["-b", "nohost", "topics", "list"])
    assert main(["--bootstrap-server", "nohost", "topics", "list"]) == EXIT_USAGE
    assert "host:port" in capsys.readouterr().err
    assert main(["topics", "list", "--bootstrap-server"]) == EXIT_USAGE


def test_everything_after_a_double_dash_is_left_alone() -> None:
    found, rest = split_global_options(["produce", "t", "--", "-b", "x"])
    assert found == {} and rest == ["produce", "t", "--", "-b", "x"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("tidelog 0.")


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["consume", "--help"], ["produce", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "exit codes:" in capsys.readouterr().out
    for code in ("0 ", "1 ", "2 ", "3 ", "4 ", "5 ", "130"):
        assert f"\n  {code}" in EXIT_CODES_HELP


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidTopicError("bad"), EXIT_USAGE),
        (InvalidConfigError("bad"), EXIT_USAGE),
        (ValueError("bad"), EXIT_USAGE),
        (UnknownTopicOrPartitionError("gone"), EXIT_NOT_FOUND),
        (GroupIdNotFoundError("gone"), EXIT_NOT_FOUND),
        (BrokerNotAvailableError("down"), EXIT_UNAVAILABLE),
        (RequestTimedOutError("slow"), EXIT_UNAVAILABLE),
        (NotEnoughReplicasAfterAppendError("isr shrank"), EXIT_UNAVAILABLE),
        (NonEmptyGroupError("busy"), EXIT_ERROR),
    ],
)
def test_exit_code_per_kind_of_error(error: Exception, code: int) -> None:
    assert exit_code_for(error) == code


class _RpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "refused"


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (grpc.StatusCode.UNAUTHENTICATED, EXIT_AUTH),
        (grpc.StatusCode.PERMISSION_DENIED, EXIT_AUTH),
        (grpc.StatusCode.UNAVAILABLE, EXIT_UNAVAILABLE),
        (grpc.StatusCode.INVALID_ARGUMENT, EXIT_USAGE),
    ],
)
def test_exit_code_of_a_raw_grpc_error(status: grpc.StatusCode, code: int) -> None:
    assert exit_code_for(_RpcError(status)) == code


def test_client_properties_take_kafka_names_and_types() -> None:
    assert client_properties(
        ["linger.ms=20", "enable.idempotence=true", "acks=all", "compression.type=lz4"],
        ProducerConfig,
        "--producer-property",
    ) == {"linger_ms": 20, "enable_idempotence": True, "acks": "all", "compression_type": "lz4"}
    assert client_properties(
        ["fetch.max.wait.ms=100", "auto.offset.reset=earliest"], ConsumerConfig, "--c"
    ) == {"fetch_max_wait_ms": 100, "auto_offset_reset": "earliest"}


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        ("lingr.ms=1", "unknown property 'lingr.ms'"),
        ("linger.ms=soon", "expected a number"),
        ("enable.idempotence=yes", "true or false"),
        ("value.serializer=x", "unknown property"),
        ("bootstrap.servers=h:1", "unknown property"),
        ("linger.ms", "key=value"),
    ],
)
def test_bad_client_properties_name_the_problem(pair: str, message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        client_properties([pair], ProducerConfig, "--producer-property")


def test_security_options_are_global_too() -> None:
    found, rest = split_global_options(
        ["--security-protocol", "SSL", "topics", "list", "--ssl-cafile=/ca.pem", "-b", "h:1"]
    )
    assert found == {"security_protocol": "SSL", "ssl_cafile": "/ca.pem", "bootstrap_server": "h:1"}
    assert rest == ["topics", "list"]
