"""Which producer epochs InitProducerId handed out, for the produce path.

Epochs move only through InitProducerId (issue 16 item 5): a batch whose
epoch is newer than the one its partition knows for the producer id fences
the older instance, so the broker accepts it only if InitProducerId gave
that id this epoch. Otherwise any client could send another producer's id
with epoch + 1 and fence the real producer for good.

An id allocated without a producer key only ever has epoch 0; a keyed id has
the epoch last written for its key:

- standalone (`LocalEpochs`): read from the broker's own `LocalProducerIds`
  (the same process allocates), so the answer is exact;
- cluster mode (`EtcdEpochs`): the coordinators write
  `<prefix>/producer_ids/keys/<key>` = {producer_id, epoch}. The broker keeps
  id -> epoch from those keys, and re-reads them (`confirm`, before the
  append) when a batch brings an epoch above what it knows: a producer that
  just got its epoch may reach the leader before the leader has seen it.
  Re-reads are coalesced and spaced by `REFRESH_INTERVAL_S`, so a client
  sending made-up epochs costs one etcd read per interval, not per request.

The produce path calls `highest_epoch` synchronously (through
ProducerStateManager.check), after the servicer has awaited `confirm`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from typing import Protocol

import aetcd
from tidelog.records import HEADER_SIZE, LOG_OVERHEAD, read_header
from tidelog_server.etcd.keys import Keys

from tidelog_broker.producer_ids import LocalProducerIds

log = logging.getLogger("tidelog.broker")

#: Least time between two re-reads of the producer keys from etcd.
REFRESH_INTERVAL_S = 0.2


def new_epochs(records: Iterable[bytes]) -> list[tuple[int, int]]:
    """(producer id, epoch) of every idempotent batch in produce payloads
    (headers only; a malformed payload yields what precedes the damage, the
    append's own validation reports it)."""
    out: list[tuple[int, int]] = []
    for data in records:
        pos = 0
        end = len(data)
        while pos + HEADER_SIZE <= end:
            header = read_header(data, pos)
            if header.producer_id >= 0:
                out.append((header.producer_id, header.producer_epoch))
            if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
                break
            pos += header.size
    return out


class ProducerEpochs(Protocol):
    """What the produce path asks (see the module doc)."""

    def highest_epoch(self, producer_id: int) -> int: ...

    async def confirm(self, batches: list[tuple[int, int]]) -> None: ...


class LocalEpochs:
    """Standalone: the epochs this broker's own allocator handed out."""

    def __init__(self, producer_ids: LocalProducerIds) -> None:
        self._producer_ids = producer_ids

    def highest_epoch(self, producer_id: int) -> int:
        return self._producer_ids.highest_epoch(producer_id)

    async def confirm(self, batches: list[tuple[int, int]]) -> None:
        return None  # exact already: the same process allocates


class EtcdEpochs:
    """Cluster mode: the keyed producers' epochs, read from etcd (module doc).
    One event loop uses it."""

    def __init__(self, client: aetcd.Client, keys: Keys) -> None:
        self._client = client
        self._prefix = keys.producer_key("")
        self._epochs: dict[int, int] = {}
        self._refreshing: asyncio.Future[None] | None = None
        self._last_refresh = -REFRESH_INTERVAL_S

    def highest_epoch(self, producer_id: int) -> int:
        return self._epochs.get(producer_id, 0)

    async def confirm(self, batches: list[tuple[int, int]]) -> None:
        """Re-read the epochs if a batch brings one above what is known (a
        second time if the first read joined was already under way: it may
        have started before the producer's epoch was written)."""
        for _ in range(2):
            if not any(epoch > self.highest_epoch(pid) for pid, epoch in batches):
                return
            await self._refresh()

    async def _refresh(self) -> None:
        if self._refreshing is not None:
            await asyncio.shield(self._refreshing)
            return
        self._refreshing = asyncio.get_running_loop().create_future()
        try:
            wait = self._last_refresh + REFRESH_INTERVAL_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            epochs: dict[int, int] = {}
            for kv in await self._client.get_prefix(self._prefix):
                try:
                    record = json.loads(kv.value)
                    producer_id, epoch = int(record["producer_id"]), int(record["epoch"])
                except (ValueError, KeyError, TypeError):
                    continue
                epochs[producer_id] = max(epoch, epochs.get(producer_id, 0))
            self._epochs = epochs
        except Exception:
            # etcd unreachable: keep what is known; a batch with an unseen
            # epoch is refused until the next successful read.
            log.warning("reading producer epochs from etcd failed", exc_info=True)
        finally:
            self._last_refresh = time.monotonic()
            self._refreshing.set_result(None)
            self._refreshing = None
