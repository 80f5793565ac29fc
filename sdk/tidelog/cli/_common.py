"""What every command shares: the global options (accepted before or after
the subcommand), argument types, client properties with Kafka's names, the
topic check, exit codes, progress output."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

import grpc

from tidelog._connection import Cluster
from tidelog.config import BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP, CommonConfig, default_bootstrap
from tidelog.errors import (
    AuthorizationFailedError,
    BrokerNotAvailableError,
    CoordinatorNotAvailableError,
    GroupIdNotFoundError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTimestampError,
    InvalidTopicError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    SaslAuthenticationError,
    TidelogError,
    TidelogTimeoutError,
    UnknownTopicOrPartitionError,
    error_from_rpc,
)
from tidelog.names import validate_topic_name

AddBootstrap = Callable[[argparse.ArgumentParser], None]

#: Exit codes, a small documented set (EXIT_CODES_HELP; README). Scripts
#: can tell "fix the command" (2) from "it is not there" (3) from "try
#: again later" (4) without parsing messages.
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNAVAILABLE = 4
EXIT_AUTH = 5
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """exit codes:
  0    success
  1    an error the cluster answered that no code below covers (produce: some
       records were not acknowledged)
  2    usage: the command line is wrong (unknown option, a bad value, an invalid
       topic name, config or request)
  3    not found: a topic, partition or consumer group that does not exist
  4    unavailable: no broker or coordinator answered, or a request timed out
       (retrying later may succeed)
  5    refused: authentication or authorization failed
  130  interrupted (Ctrl-C)"""

_USAGE_ERRORS: tuple[type[TidelogError], ...] = (
    InvalidRequestError,
    InvalidTopicError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTimestampError,
)
_NOT_FOUND_ERRORS: tuple[type[TidelogError], ...] = (
    UnknownTopicOrPartitionError,
    GroupIdNotFoundError,
)
_UNAVAILABLE_ERRORS: tuple[type[TidelogError], ...] = (
    BrokerNotAvailableError,
    CoordinatorNotAvailableError,
    TidelogTimeoutError,
    RequestTimedOutError,
    NotEnoughReplicasError,
    NotEnoughReplicasAfterAppendError,
    NotLeaderOrFollowerError,
)
_AUTH_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def exit_code_for(error: BaseException) -> int:
    """The exit code of a command that failed with `error` (EXIT_CODES_HELP)."""
    if isinstance(error, grpc.RpcError):
        if error.code() in _AUTH_CODES:
            return EXIT_AUTH
        error = error_from_rpc(error)
    if isinstance(error, AuthorizationFailedError | SaslAuthenticationError):
        return EXIT_AUTH
    if isinstance(error, (*_USAGE_ERRORS, ValueError, TypeError)):
        return EXIT_USAGE
    if isinstance(error, _NOT_FOUND_ERRORS):
        return EXIT_NOT_FOUND
    if isinstance(error, _UNAVAILABLE_ERRORS):
        return EXIT_UNAVAILABLE
    return EXIT_ERROR


#: Options every command takes, before or after the subcommand.
GLOBAL_VALUE_OPTIONS = {
    "--bootstrap-server": "bootstrap_server",
    "-b": "bootstrap_server",
    # The clients' security settings, under Kafka's names (tidelog.security).
    # main() hands them to every client the command makes through the same
    # environment variables a script would set (config.SECURITY_ENV); the
    # password only from $TIDELOG_SASL_PASSWORD: a command line is visible
    # to every user of the machine (ps).
    "--security-protocol": "security_protocol",
    "--ssl-cafile": "ssl_cafile",
    "--ssl-certfile": "ssl_certfile",
    "--ssl-keyfile": "ssl_keyfile",
    "--sasl-username": "sasl_plain_username",
}


def split_global_options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Take the global options out of `argv`, wherever they stand (before the
    subcommand, as kafka-topics users type them, or after it), so that every
    subcommand, whoever wrote it, accepts them in both places. Stops at `--`.
    The last one given wins. Raises ArgumentTypeError for a bad value."""
    found: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            rest.extend(argv[i:])
            break
        name, eq, inline = token.partition("=")
        dest = GLOBAL_VALUE_OPTIONS.get(name if eq and name.startswith("--") else token)
        if dest is None:
            rest.append(token)
            i += 1
            continue
        if eq and name.startswith("--"):
            value = inline
            i += 1
        elif i + 1 < len(argv):
            value = argv[i + 1]
            i += 2
        else:
            metavar = "HOST:PORT" if dest == "bootstrap_server" else "a value"
            raise argparse.ArgumentTypeError(f"{token} expects {metavar}")
        found[dest] = _bootstrap(value) if dest == "bootstrap_server" else value
    return found, rest


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    """For `--help`: main() takes these out of the command line first, as
    --bootstrap-server, and passes them to every client of the command."""
    group = parser.add_argument_group(
        "security (Kafka's names; default: $TIDELOG_SECURITY_PROTOCOL, $TIDELOG_SSL_CAFILE, ...)"
    )
    group.add_argument("--security-protocol", choices=["PLAINTEXT", "SSL", "SASL_SSL"])
    group.add_argument("--ssl-cafile", metavar="PEM", help="authorities to trust")
    group.add_argument("--ssl-certfile", metavar="PEM", help="client certificate (mTLS)")
    group.add_argument("--ssl-keyfile", metavar="PEM", help="key of --ssl-certfile")
    group.add_argument(
        "--sasl-username",
        metavar="NAME",
        help="with SASL_SSL; the password from $TIDELOG_SASL_PASSWORD",
    )


class ArgumentParser(argparse.ArgumentParser):
    """argparse with its errors on one line, without the usage block."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _bootstrap(text: str) -> str:
    """--bootstrap-server: host:port[,host:port...], checked as clients will."""
    try:
        CommonConfig(bootstrap_servers=text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (for example 127.0.0.1:9392)") from None
    return text


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    """For `--help`: main() takes the option out of the command line first
    (split_global_options), wherever it stands, and sets args.bootstrap_server."""
    parser.add_argument(
        "-b",
        "--bootstrap-server",
        type=_bootstrap,
        default=default_bootstrap(),
        metavar="HOST:PORT",
        help=f"a broker to connect to (default: ${BOOTSTRAP_ENV} or {DEFAULT_BOOTSTRAP})",
    )


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= low."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is out of range: use at least {low}")
        return value

    parse.__name__ = f"integer >= {low}"  # what argparse names in its messages
    return parse


def check_topic(bootstrap: str, topic: str, *, allow_auto_create: bool = False) -> int:
    """The topic's partition count, from one Metadata answer; raises
    UnknownTopicOrPartitionError naming the topic when it does not exist (a
    broker with auto.create.topics.enable creates it when allowed),
    InvalidTopicError for a bad name, BrokerNotAvailableError naming the
    addresses when no broker answers. Unlike the clients, it does not wait
    for a topic to appear: a command fails at once."""

    async def look() -> int:
        cluster = Cluster(
            CommonConfig(bootstrap_servers=bootstrap),
            allow_auto_topic_creation=allow_auto_create,
        )
        try:
            snapshot = await cluster.refresh([topic])
        finally:
            await cluster.close()
        meta = snapshot.topics.get(topic)
        if meta is not None and meta.error is not None:
            raise meta.error
        if meta is None or not meta.leaders:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        return meta.partition_count

    validate_topic_name(topic)
    return asyncio.run(look())


def unescape(text: str) -> str:
    """Backslash escapes in separators and formats, as kcat reads them:
    \\n, \\t, \\r, \\0 and \\\\ (a shell passes them as two characters)."""
    if "\\" not in text:
        return text
    out = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            mapped = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\"}.get(nxt)
            if mapped is not None:
                out.append(mapped)
                i += 2
                continue
        out.append(char)
        i += 1
    return "".join(out)


#: Client options a --producer-property/--consumer-property may not set: the
#: command sets them from its own options, or they take Python objects.
_RESERVED_PROPERTIES = frozenset(
    {
        "bootstrap_servers",
        "group_id",
        "key_serializer",
        "value_serializer",
        "key_deserializer",
        "value_deserializer",
        "partitioner",
    }
)


def client_properties(pairs: list[str], config: type, flag: str) -> dict[str, Any]:
    """`--producer-property linger.ms=10` and the like: Kafka's names (dots or
    underscores) to the client's keyword arguments, converted to the field's
    type. An unknown name or a bad value raises InvalidConfigError naming it."""
    fields = {f.name: str(f.type) for f in dataclasses.fields(config)}
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        key = name.strip().replace(".", "_").replace("-", "_")
        if not sep or not key:
            raise InvalidConfigError(f"{flag} expects key=value, got {pair!r}")
        if key not in fields or key in _RESERVED_PROPERTIES:
            known = ", ".join(
                sorted(k.replace("_", ".") for k in fields if k not in _RESERVED_PROPERTIES)
            )
            raise InvalidConfigError(f"{flag}: unknown property {name!r}; known: {known}")
        out[key] = _convert_property(name, text.strip(), fields[key], flag)
    return out


def _convert_property(name: str, text: str, kind: str, flag: str) -> Any:
    if text.lower() in ("none", "null") and "None" in kind:
        return None
    if kind.startswith("bool"):
        if text.lower() not in ("true", "false"):
            raise InvalidConfigError(f"{flag} {name}={text!r}: expected true or false")
        return text.lower() == "true"
    if "Literal" in kind and not kind.startswith("int"):
        return text  # the client checks the choice and names it
    if kind.startswith(("int", "float")):
        if kind.startswith("int") and "Literal" in kind and text == "all":
            return text  # acks=all
        try:
            return int(text) if kind.startswith("int") else float(text)
        except ValueError:
            raise InvalidConfigError(f"{flag} {name}={text!r}: expected a number") from None
    return text


def fail(message: str, code: int = EXIT_ERROR) -> int:
    print(f"tidelog: {message}", file=sys.stderr)
    return code


class Progress:
    """A one-line counter on stderr, only when stderr is a terminal, at most
    a few updates per second so that printing never slows the work."""

    _INTERVAL_S = 0.2

    def __init__(self, label: str, stream: Any = None) -> None:
        self._stream = stream or sys.stderr
        self._enabled = self._stream.isatty()
        self._label = label
        self._last = 0.0

    def update(self, count: int) -> None:
        if not self._enabled:
            return
        now = time.monotonic()
        if now - self._last >= self._INTERVAL_S:
            self._last = now
            self._stream.write(f"\r{self._label} {count:,}")
            self._stream.flush()

    def done(self) -> None:
        if self._enabled and self._last:
            self._stream.write("\r\033[K")
            self._stream.flush()
