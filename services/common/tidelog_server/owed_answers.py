"""The answers a pipelined stream owes its client, in order, and how its
reading ended: the hand-over between the task that reads a Produce stream's
requests and the one that writes its answers (the broker's Log Produce, the
gateway's Log Produce and Records Produce).

The reader `push`es each answer (a future, or whatever the writer awaits)
as soon as it has acted on the request, then waits in `room()` while
`limit` answers are owed: it reads no more, which pushes back on a client
that sends without reading. The writer `get`s the answers in order. When
the reading ends, for any reason (the client half-closed, went away, sent a
request that is refused, the service drains), the reader calls `end`, with
the error if there is one, and `get` returns None once every answer pushed
before it has been taken.

Why not an asyncio.Queue closed by a sentinel: the sentinel needs a free
slot, and a client that pipelines `limit` requests without reading fills
them all. A sentinel put without waiting was then dropped (and with it the
refusal, or the end of the stream: the stream waited until the client
cancelled, holding its budgets); one put with waiting would hang a reader
that is being cancelled. Here the end is a flag, which nothing refuses.
And `push` never waits, so the answer to a request already acted on
(appended, forwarded) is never lost to a cancel of the reader: the wait for
room comes after it, and a reader cancelled there has lost nothing. (So up
to `limit` + 1 answers may be owed for a moment.)

Not thread-safe: one event loop, one reader and one writer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class OwedAnswers(Generic[T]):
    """The answers one stream owes, in order (see module doc)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a stream must be allowed to owe at least 1 answer, got {limit}")
        self._limit = limit
        self._owed: deque[T] = deque()
        self._ended = False
        #: Why the reading ended (None: the client half-closed, or the
        #: reader stopped on purpose); set by the first `end`.
        self.error: BaseException | None = None
        # The writer waiting for an answer or the end; the reader waiting
        # for room. At most one of each.
        self._getter: asyncio.Future[None] | None = None
        self._putter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._owed)

    @property
    def ended(self) -> bool:
        """Whether the reading has ended (`end` was called)."""
        return self._ended

    def push(self, answer: T) -> None:
        """Owe `answer`, after those pushed before. Never waits (see module
        doc); call `room()` after it."""
        self._owed.append(answer)
        _wake(self._getter)

    async def room(self) -> None:
        """Return once fewer than `limit` answers are owed."""
        while len(self._owed) >= self._limit:
            self._putter = asyncio.get_running_loop().create_future()
            try:
                await self._putter
            finally:
                self._putter = None

    def end(self, error: BaseException | None = None) -> None:
        """The reading has ended (with `error`, if any): no more answers.
        Only the first call counts."""
        if not self._ended:
            self._ended = True
            self.error = error
        _wake(self._getter)

    async def get(self) -> T | None:
        """The next answer owed, waiting for one; None once the reading has
        ended and every answer has been taken."""
        while not self._owed:
            if self._ended:
                return None
            self._getter = asyncio.get_running_loop().create_future()
            try:
                await self._getter
            finally:
                self._getter = None
        answer = self._owed.popleft()
        _wake(self._putter)
        return answer

    def take_all(self) -> list[T]:
        """Every answer still owed, forgotten here (a stream that ends early
        cancels them)."""
        left = list(self._owed)
        self._owed.clear()
        _wake(self._putter)
        return left


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
