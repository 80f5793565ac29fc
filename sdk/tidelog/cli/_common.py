"""What every command shares: the bootstrap option, argument types, the
topic check, errors, progress output."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from tidelog._connection import Cluster
from tidelog.config import BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP, CommonConfig, default_bootstrap
from tidelog.errors import UnknownTopicOrPartitionError
from tidelog.names import validate_topic_name

AddBootstrap = Callable[[argparse.ArgumentParser], None]

#: Exit codes: 1 for an error the cluster answered (or could not be reached),
#: 2 for a command line that is wrong in itself (as argparse does).
EXIT_ERROR = 1
EXIT_USAGE = 2


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
    parser.add_argument(
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
