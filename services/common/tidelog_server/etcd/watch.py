"""`PrefixWatcher`: every key under a prefix, as a listing and then its changes.

A follower of etcd state that survives etcd restarts and compaction:

- it first lists the prefix (revision R) and delivers that as a reset batch;
- it then watches from R + 1 and delivers the changes in batches, each
  holding every change received since the last batch was taken (at least
  one whole watch response: etcd sends the events of one transaction, and
  often of many, in one response), remembering the revision of the last;
- after a lost connection (aetcd raises ConnectionFailedError and the watch
  must be re-created) it watches again from last revision + 1, so no change
  is missed and none is delivered twice;
- if that revision was compacted meanwhile, it lists again and delivers a new
  reset batch (the consumer replaces what it knew);
- if the consumer's callback raises on a batch (it may have applied part of
  it), it lists again the same way, after a pause: resuming after that batch
  would leave the consumer short of its other changes until the next listing.

The consumer's callback runs on the watcher's task, one batch at a time, in
revision order. A batch may hold several changes of one key: applied in
order, the last one wins.

Why batches: aetcd's watch iterator hands over a response's events one by
one. A topic of 3,000 partitions, the elections after a broker died, or a
coordinator's metadata of many groups arrive as a few responses of thousands
of events; one callback per event made every consumer repeat its per-batch
work (reconciles, wake-ups, yields) per key. A pump task moves the events
into a queue as aetcd hands them over (without waiting while any are there),
and the watcher takes all that the queue holds at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aetcd
import aetcd.exceptions
import aetcd.rtypes

from tidelog_server.cancellation import raise_if_cancelling
from tidelog_server.etcd.client import EtcdAccessError, is_unavailable
from tidelog_server.etcd.keys import prefix_end

log = logging.getLogger("tidelog.etcd.watch")

RETRY_DELAY_MIN_S = 0.05
RETRY_DELAY_MAX_S = 1.0


@dataclass(frozen=True, slots=True)
class Change:
    """One key's new value (None: deleted) at `mod_revision`."""

    key: bytes
    value: bytes | None
    mod_revision: int
    create_revision: int = 0
    lease: int = 0


@dataclass(slots=True)
class WatchBatch:
    """Changes to apply in order. When `reset`, `changes` is the complete
    listing and replaces everything known before."""

    reset: bool
    changes: list[Change] = field(default_factory=list)
    revision: int = 0


class PrefixWatcher:
    """Follows one prefix; run() until cancelled. Single consumer, one loop."""

    def __init__(
        self,
        client: aetcd.Client,
        prefix: bytes,
        on_batch: Callable[[WatchBatch], Awaitable[None]],
        name: str = "",
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.on_batch = on_batch
        self.name = name or prefix.decode()
        #: Revision of the last change delivered (0: nothing listed yet).
        self.revision = 0
        #: Set after the first listing has been delivered.
        self.synced = asyncio.Event()

    async def run(self) -> None:
        delay_s = RETRY_DELAY_MIN_S
        need_listing = True
        while True:
            try:
                if need_listing:
                    await self._list()
                    need_listing = False
                await self._follow()
            except aetcd.exceptions.RevisionCompactedError as exc:
                log.info("watch %s: revision compacted (%s); listing again", self.name, exc)
                need_listing = True
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise_if_cancelling(exc)
                if isinstance(exc, _NotApplied):
                    # The consumer may hold part of the batch: resuming after
                    # it would leave it short of the rest for good. A listing
                    # replaces what it knows.
                    log.error(
                        "watch %s: applying a batch failed; listing again",
                        self.name,
                        exc_info=exc.__cause__,
                    )
                    need_listing = True
                elif isinstance(exc, EtcdAccessError):
                    # etcd's RBAC: the message says it all; no traceback.
                    log.error("watch %s: %s; resuming", self.name, exc)
                elif not is_unavailable(exc):
                    log.exception("watch %s failed; resuming", self.name)
                else:
                    log.info("watch %s: etcd unreachable (%s); resuming", self.name, exc)
                await asyncio.sleep(delay_s)
                delay_s = min(RETRY_DELAY_MAX_S, delay_s * 2)
                continue
            delay_s = RETRY_DELAY_MIN_S

    async def _list(self) -> None:
        listing = await self.client.get_prefix(self.prefix)
        self.revision = listing.header.revision
        changes = [
            Change(kv.key, kv.value, kv.mod_revision, kv.create_revision, kv.lease)
            for kv in listing
        ]
        await self.on_batch(WatchBatch(True, changes, self.revision))
        self.synced.set()

    async def _follow(self) -> None:
        watch = await self.client.watch(
            self.prefix, range_end=prefix_end(self.prefix), start_revision=self.revision + 1
        )
        received: asyncio.Queue[aetcd.rtypes.Event | Exception] = asyncio.Queue()
        pump = asyncio.create_task(_pump(watch, received), name=f"watch-{self.name}-events")
        try:
            raise_if_cancelling()  # aetcd's watch creation can swallow a cancel
            while True:
                changes, ended = _take_all(received, await received.get())
                if changes:
                    self.revision = max(self.revision, changes[-1].mod_revision)
                    try:
                        await self.on_batch(WatchBatch(False, changes, self.revision))
                    except Exception as exc:
                        raise _NotApplied() from exc
                if ended is not None:
                    # Every event received before it was delivered: the next
                    # watch resumes right after the last of them.
                    raise ended
        finally:
            pump.cancel()
            # wait(), not await: a cancel of this task still propagates.
            await asyncio.wait([pump])
            try:
                await watch.cancel()
            except Exception as exc:
                log.debug("cancelling watch %s: %s", self.name, exc)


class _NotApplied(Exception):
    """on_batch raised (the cause) on a batch of changes: run() lists again."""


async def _pump(watch: aetcd.rtypes.Watch, received: asyncio.Queue[Any]) -> None:
    """Move `watch`'s events into `received` as aetcd hands them over (it
    does not wait between the events already received); its end or error
    last."""
    try:
        async for event in watch:
            received.put_nowait(event)
        # The iterator ends without an error only when the watch was cancelled.
        received.put_nowait(aetcd.exceptions.ConnectionFailedError("watch stream ended"))
    except Exception as exc:
        received.put_nowait(exc)


def _take_all(
    received: asyncio.Queue[Any], first: aetcd.rtypes.Event | Exception
) -> tuple[list[Change], Exception | None]:
    """`first` and everything queued after it, without waiting: the changes
    in revision order, and the error that ended the watch, if it came."""
    changes: list[Change] = []
    item = first
    while not isinstance(item, Exception):
        kv = item.kv
        deleted = item.kind == "DELETE"
        changes.append(
            Change(
                kv.key, None if deleted else kv.value, kv.mod_revision, kv.create_revision, kv.lease
            )
        )
        if received.empty():
            return changes, None
        item = received.get_nowait()
    return changes, item
