"""What every command shares: the bootstrap option, errors, progress output."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

DEFAULT_BOOTSTRAP = "127.0.0.1:9392"
BOOTSTRAP_ENV = "TIDELOG_BOOTSTRAP"

AddBootstrap = Callable[[argparse.ArgumentParser], None]


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap-server",
        default=os.environ.get(BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP),
        metavar="HOST:PORT",
        help=f"a broker to connect to (default: ${BOOTSTRAP_ENV} or {DEFAULT_BOOTSTRAP})",
    )


def fail(message: str) -> int:
    print(f"tidelog: {message}", file=sys.stderr)
    return 1


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
