"""`Election`: one leader among candidates, like etcd's concurrency.Election.

Each candidate writes `<election prefix><lease id>` bound to its session's
lease, only if absent (create revision == 0), so a retried campaign never
creates a second key; a campaign that finds its key already there (a retry
on the same session) keeps its place and puts its new value. Candidates are
ordered by create revision: the lowest is the leader. A waiting candidate
asks etcd for its predecessor only (the key with the greatest create
revision below its own, keys only) and watches that key's deletion, so a
leader change wakes one process, and a wake costs one key whatever the
number of candidates.

Fencing: the leader's writes include `leader_compare()`, which holds only
while its key still exists with the same create revision; a deposed leader
that has not noticed yet (a long pause, a partition) cannot write.

Not thread-safe: use from one event loop.
"""

from __future__ import annotations

import logging
from typing import Any

import aetcd
import aetcd.rpc

from tidelog_server.cancellation import raise_if_cancelling
from tidelog_server.etcd.client import raw_kv
from tidelog_server.etcd.keys import prefix_end
from tidelog_server.etcd.session import Session

log = logging.getLogger("tidelog.etcd.election")


class ElectionKeyLostError(Exception):
    """Our candidacy key is gone: the session's lease expired or was revoked."""


class Election:
    """A campaign on `prefix` by one session."""

    def __init__(self, session: Session, prefix: bytes) -> None:
        self.session = session
        self.client: aetcd.Client = session.client
        self.prefix = prefix
        self.key = prefix + f"{session.lease_id:x}".encode()
        #: Create revision of our key once campaigning; the fencing token.
        self.create_revision = 0

    async def campaign(self, value: bytes) -> None:
        """Return once this candidate is the leader. Cancel to give up.

        Raises ElectionKeyLostError when our key vanishes meanwhile."""
        tx = self.client.transactions
        ok, responses = await self.client.transaction(
            compare=[tx.create(self.key) == 0],
            success=[tx.put(self.key, value, lease=self.session.lease_id)],
            failure=[tx.get(self.key)],
        )
        if ok:
            self.create_revision = responses[0].response_put.header.revision
        else:
            # Our key exists from an earlier attempt (same lease): keep its
            # place in the line, but stand with the value asked for now.
            existing = responses[0][0][1]
            self.create_revision = existing.create_revision
            if existing.value != value:
                await self.proclaim(value)
        while True:
            predecessor = await self._predecessor()
            if predecessor is None:
                return
            key, revision = predecessor
            await self._wait_deleted(key, revision)

    async def proclaim(self, value: bytes) -> None:
        """Replace our key's value, keeping its create revision (our place)."""
        tx = self.client.transactions
        ok, _ = await self.client.transaction(
            compare=[self.leader_compare()],
            success=[tx.put(self.key, value, lease=self.session.lease_id)],
            failure=[],
        )
        if not ok:
            raise ElectionKeyLostError(f"election key {self.key!r} vanished")

    async def _predecessor(self) -> tuple[bytes, int] | None:
        """The key of the candidate just before us and the revision it was
        read at; None when we lead. One transaction: our key must still be
        there (else the lease is gone), and the range asks for one key only
        (like etcd's waitDeletes: last by create revision, below ours)."""
        rpc = aetcd.rpc
        before = rpc.RangeRequest(
            key=self.prefix,
            range_end=prefix_end(self.prefix),
            limit=1,
            sort_order=rpc.RangeRequest.DESCEND,
            sort_target=rpc.RangeRequest.CREATE,
            max_create_revision=self.create_revision - 1,
            keys_only=True,
        )
        request = rpc.TxnRequest(
            compare=[self.leader_compare().build_message()],
            success=[rpc.RequestOp(request_range=before)],
        )
        # aetcd's range call cannot say limit or max_create_revision: the raw
        # stub can (its errors are raw AioRpcErrors, which is_unavailable knows).
        reply = await raw_kv(self.client, "Txn", request)
        if not reply.succeeded:
            raise ElectionKeyLostError(
                f"election key {self.key!r} vanished: the session's lease is gone"
            )
        kvs = reply.responses[0].response_range.kvs
        if not kvs:
            return None
        return kvs[0].key, reply.header.revision

    async def _wait_deleted(self, key: bytes, revision: int) -> None:
        """Until `key` (present at `revision`) is deleted."""
        watch = await self.client.watch(key, start_revision=revision + 1)
        try:
            raise_if_cancelling()  # aetcd's watch creation can swallow a cancel
            async for event in watch:
                if event.kind == "DELETE":
                    return
        finally:
            await watch.cancel()

    def leader_compare(self) -> Any:
        """A transaction compare that holds only while we are still the leader."""
        return self.client.transactions.create(self.key) == self.create_revision

    async def is_leader(self) -> bool:
        """Ask etcd (not our memory) whether our key is still the lowest."""
        first = await _first(self.client, self.prefix)
        return first is not None and first.key == self.key

    async def resign(self) -> None:
        """Delete our candidacy (the next candidate takes over at once)."""
        tx = self.client.transactions
        # aetcd needs an explicit (empty) failure list.
        await self.client.transaction(
            compare=[self.leader_compare()], success=[tx.delete(self.key)], failure=[]
        )

    @staticmethod
    async def leader(client: aetcd.Client, prefix: bytes) -> bytes | None:
        """The current leader's value, or None when there is no candidate."""
        first = await _first(client, prefix)
        return None if first is None else bytes(first.value)


async def _first(client: aetcd.Client, prefix: bytes) -> Any:
    """The candidate with the lowest create revision (one key read), or None."""
    rpc = aetcd.rpc
    request = rpc.RangeRequest(
        key=prefix,
        range_end=prefix_end(prefix),
        limit=1,
        sort_order=rpc.RangeRequest.ASCEND,
        sort_target=rpc.RangeRequest.CREATE,
    )
    reply = await raw_kv(client, "Range", request)
    return reply.kvs[0] if reply.kvs else None
