"""Rate-limited logging for errors that loops repeat.

A background loop that fails the same way for every partition, every pass
(descriptors exhausted, a disk full, an unreachable peer), would otherwise
write a traceback per partition per pass: issue 16 saw 2.8 GB of logs in six
minutes. `RateLimitedLog` writes the first occurrence of each kind of message
at once, then at most one per interval, saying how many it suppressed since.

A kind is the message's format string and the exception's type (not its
arguments): "flush of %s-%d failed" with OSError is one kind whatever the
partition, so 7,000 failing partitions log once per interval, not 7,000
times.

The broker's background loops (flush, retention, cleaner, replica fetchers)
and the coordinator's (leader-election passes, offset expiry, the controller
loop) use it. Not thread-safe: each is used from one service's event loop.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Seconds between two messages of one kind.
DEFAULT_INTERVAL_S = 60.0


@dataclass
class _Kind:
    last_logged: float
    suppressed: int = 0


class RateLimitedLog:
    """Logs each kind of message at most once per `interval_s`."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._kinds: dict[tuple[int, str, str], _Kind] = {}

    def exception(self, msg: str, *args: object) -> None:
        """`logger.exception`, rate-limited (call it from an except block)."""
        self.log(logging.ERROR, msg, *args, exc_info=True)

    def warning(self, msg: str, *args: object) -> None:
        self.log(logging.WARNING, msg, *args)

    def error(self, msg: str, *args: object) -> None:
        self.log(logging.ERROR, msg, *args)

    def log(self, level: int, msg: str, *args: object, exc_info: bool = False) -> None:
        exc_type = sys.exc_info()[0] if exc_info else None
        key = (level, msg, exc_type.__qualname__ if exc_type is not None else "")
        now = self._clock()
        kind = self._kinds.get(key)
        if kind is not None and now - kind.last_logged < self._interval_s:
            kind.suppressed += 1
            return
        suppressed = 0 if kind is None else kind.suppressed
        self._kinds[key] = _Kind(now)
        if suppressed:
            msg = f"{msg} (and {suppressed} more like it in the last {self._interval_s:g} s)"
        self._logger.log(level, msg, *args, exc_info=exc_info)
