"""Group commit of offsets: many concurrent commits, one etcd transaction.

etcd makes each transaction durable with one raft entry and one fsync (~1.5 ms
here, ~650 sequential transactions/s), so one transaction per commit request
caps a coordinator at a few hundred commits a second. The `OffsetCommitter`
owns one task that takes every commit queued while the previous transaction
was in flight and writes them in the next one, each commit as a *nested*
transaction with its own compare (its fence: the member key's mod revision,
or "the group has no members"). etcd evaluates every nested compare against
the state before the transaction and applies exactly the branches whose
compares hold, so one commit's stale epoch fails that commit alone; the
answer says, per nested transaction, whether it was applied.

What stays as it was with one transaction per commit:
- durability: a commit is answered only after the transaction holding it
  returned, so an acknowledged commit is in etcd;
- fencing: each commit keeps its own compare;
- atomicity: a commit's puts are in one outer transaction (split into
  several nested ones with the same compare when it has more than a nested
  transaction may hold), unless it alone is too big for one transaction
  (etcd's --max-txn-ops and request size): then it is written in several, as
  before, each fenced;
- a failed transaction (etcd unreachable, or refusing it) fails every commit
  in it, none is acknowledged.

etcd refuses a transaction that puts one key twice, even in nested branches
that exclude each other, so a batch ends before a commit that shares a key
with one already in it; that commit leads the next batch (commits are taken
in arrival order). etcd also caps a transaction's operations: the nested
transactions of a batch plus the most puts in one of them may not exceed
--max-txn-ops (measured against etcd 3.5: 64 nested x 64 puts pass, 65 x 64
do not).

The transaction is built as etcd's protobuf request, directly: aetcd's
`transaction` takes its own op objects and rebuilds a request from them on
every call, which cost ~5x the CPU of filling the request in place (~29 us
against ~6 us per 10-partition commit, measured here), the largest single
cost of a commit in the coordinator.

The queue is bounded (`queue_max` commits): past it a commit is refused with
COORDINATOR_NOT_AVAILABLE naming the limit, which clients retry. One event
loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aetcd
from aetcd import rpc
from tidelog.errors import CoordinatorNotAvailableError
from tidelog_server.etcd.client import raw_kv

log = logging.getLogger("tidelog.coordinator.offsets")

#: etcd's default --max-request-bytes is 1.5 MiB: keep a transaction below it.
TXN_BYTES_MAX = 1024 * 1024
#: Per put, what the request carries besides the key and value (field tags,
#: lengths, the nested RequestOp): a generous estimate.
_PUT_OVERHEAD_BYTES = 32


@dataclass(slots=True)
class _Commit:
    """One commit request waiting for its transaction."""

    #: Its fence, as etcd's Compare message.
    compare: rpc.Compare
    #: Its puts, split into the nested transactions it takes.
    chunks: list[list[tuple[bytes, bytes]]]
    keys: frozenset[bytes]
    size_bytes: int
    future: asyncio.Future[bool]

    @property
    def widest(self) -> int:
        return max(len(c) for c in self.chunks)


class OffsetCommitter:
    """Queues commits and writes them, coalesced, one transaction at a time."""

    def __init__(
        self,
        client: aetcd.Client,
        *,
        max_txn_ops: int = 128,
        coalesce_max: int = 127,
        queue_max: int = 10_000,
        txn_bytes_max: int = TXN_BYTES_MAX,
    ) -> None:
        if max_txn_ops < 2:
            raise ValueError(f"max_txn_ops must be at least 2, not {max_txn_ops}")
        self.client = client
        self.max_txn_ops = max_txn_ops
        #: Commits per transaction at most (1: one transaction per commit).
        self.coalesce_max = max(1, coalesce_max)
        self.queue_max = queue_max
        self.txn_bytes_max = txn_bytes_max
        # Half the operations for nested transactions, half for their puts:
        # any two commits of up to this many partitions fit together.
        self._chunk = max(1, max_txn_ops // 2)
        self._queue: deque[_Commit] = deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        #: Transactions written and commits they held (tests, benchmarks).
        self.transactions = 0
        self.commits = 0

    async def submit(self, compare: Any, puts: Sequence[tuple[bytes, bytes]]) -> bool:
        """Write `puts` if `compare` (an aetcd comparison, such as
        `client.transactions.mod(key) == revision`) holds, in the next
        transaction; True when written (and durable), False when the compare
        failed. Raises what the transaction raised, or
        CoordinatorNotAvailableError when the queue is full or the committer
        is closed."""
        if self._closed:
            raise CoordinatorNotAvailableError("the coordinator is shutting down: reconnect")
        if len(self._queue) >= self.queue_max:
            raise CoordinatorNotAvailableError(
                f"too many offset commits are waiting for etcd ({len(self._queue)}, the limit "
                f"of this coordinator's commit queue is {self.queue_max}): retry later"
            )
        chunks = [list(puts[i : i + self._chunk]) for i in range(0, len(puts), self._chunk)]
        commit = _Commit(
            compare.build_message(),
            chunks,
            frozenset(k for k, _ in puts),
            sum(len(k) + len(v) + _PUT_OVERHEAD_BYTES for k, v in puts),
            asyncio.get_running_loop().create_future(),
        )
        self._queue.append(commit)
        if self._task is None or self._task.done():
            # First use, or (a bug) the task ended: commits must not hang.
            self._task = asyncio.create_task(self._run(), name="offset-committer")
        self._wakeup.set()
        return await commit.future

    async def close(self) -> None:
        """Stop the task; commits still queued fail (not written)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        error = CoordinatorNotAvailableError("the coordinator is shutting down: reconnect")
        while self._queue:
            future = self._queue.popleft().future
            if not future.done():
                future.set_exception(error)

    # ------------------------------------------------------------ the task

    def _fits_alone(self, commit: _Commit) -> bool:
        return (
            len(commit.chunks) + commit.widest <= self.max_txn_ops
            and commit.size_bytes <= self.txn_bytes_max
        )

    def _take(self) -> list[_Commit]:
        """The next batch: the longest run of queued commits, in arrival
        order, that one transaction can hold (no key twice, etcd's limits)."""
        queue = self._queue
        first = queue.popleft()
        batch = [first]
        if not self._fits_alone(first):
            return batch
        nested = len(first.chunks)
        widest = first.widest
        size = first.size_bytes
        keys = set(first.keys)
        while queue and len(batch) < self.coalesce_max:
            commit = queue[0]
            if commit.future.done():  # its caller gave up before it was written
                queue.popleft()
                continue
            more_nested = nested + len(commit.chunks)
            more_widest = max(widest, commit.widest)
            if (
                more_nested + more_widest > self.max_txn_ops
                or size + commit.size_bytes > self.txn_bytes_max
                or not keys.isdisjoint(commit.keys)
            ):
                break
            queue.popleft()
            batch.append(commit)
            nested, widest = more_nested, more_widest
            size += commit.size_bytes
            keys |= commit.keys
        return batch

    async def _run(self) -> None:
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if len(self._queue) < self.coalesce_max:
                # One pass of the event loop (no timer, no added wait when
                # idle): commits already runnable, such as the other requests
                # of a commit stream read in the same pass, join this
                # transaction instead of each paying for one of their own.
                await asyncio.sleep(0)
            batch = self._take()
            batch = [c for c in batch if not c.future.done()]
            if not batch:
                continue
            try:
                if len(batch) == 1 and not self._fits_alone(batch[0]):
                    results = [await self._write_alone(batch[0])]
                else:
                    results = await self._write(batch)
            except asyncio.CancelledError:
                for commit in batch:
                    if not commit.future.done():
                        commit.future.set_exception(
                            CoordinatorNotAvailableError(
                                "the coordinator is shutting down: reconnect"
                            )
                        )
                raise
            except Exception as exc:  # every commit of a failed transaction fails
                for commit in batch:
                    if not commit.future.done():
                        commit.future.set_exception(exc)
                continue
            for commit, ok in zip(batch, results, strict=True):
                if not commit.future.done():
                    commit.future.set_result(ok)

    @staticmethod
    def _add_nested(
        request: rpc.TxnRequest, commit: _Commit, chunks: Sequence[list[tuple[bytes, bytes]]]
    ) -> None:
        """Add to `request` one nested transaction per chunk: the commit's
        compare, then its puts (no lease, no previous value: the fields'
        defaults, left unset)."""
        add = request.success.add
        for chunk in chunks:
            nested = add().request_txn
            nested.compare.append(commit.compare)
            put = nested.success.add
            for key, value in chunk:
                op = put().request_put
                op.key = key
                op.value = value

    async def _write(self, batch: list[_Commit]) -> list[bool]:
        request = rpc.TxnRequest()
        for commit in batch:
            self._add_nested(request, commit, commit.chunks)
        responses = (await raw_kv(self.client, "Txn", request, write=True)).responses
        self.transactions += 1
        self.commits += len(batch)
        results = []
        at = 0
        for commit in batch:
            # Every nested transaction of a commit has the same compare,
            # evaluated against the same state: all applied or none.
            results.append(responses[at].response_txn.succeeded)
            at += len(commit.chunks)
        return results

    async def _write_alone(self, commit: _Commit) -> bool:
        """A commit too big for one transaction: several, each fenced by its
        compare (atomic each, not as a whole)."""
        size_per_chunk = commit.size_bytes // len(commit.chunks) + 1
        per_txn = max(
            1,
            min(
                self.max_txn_ops - commit.widest,
                self.txn_bytes_max // size_per_chunk,
            ),
        )
        for i in range(0, len(commit.chunks), per_txn):
            request = rpc.TxnRequest()
            self._add_nested(request, commit, commit.chunks[i : i + per_txn])
            responses = (await raw_kv(self.client, "Txn", request, write=True)).responses
            self.transactions += 1
            if not responses[0].response_txn.succeeded:
                return False
        self.commits += 1
        return True
