"""`Election`: one leader among candidates, like etcd's concurrency.Election.

Each candidate writes `<election prefix><lease id>` bound to its session's
lease, only if absent (create revision == 0), so a retried campaign never
creates a second key. Candidates are ordered by create revision: the lowest
is the leader. A waiting candidate watches only its predecessor (the
candidate just before it), so a leader change wakes one process, not all.

Fencing: the leader's writes include `leader_compare()`, which holds only
while its key still exists with the same create revision; a deposed leader
that has not noticed yet (a long pause, a partition) cannot write.

Not thread-safe: use from one event loop.
"""

from __future__ import annotations

import logging
from typing import Any

import aetcd

from tidelog_server.etcd.session import Session

log = logging.getLogger("tidelog.etcd.election")


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
        """Return once this candidate is the leader. Cancel to give up."""
        tx = self.client.transactions
        ok, responses = await self.client.transaction(
            compare=[tx.create(self.key) == 0],
            success=[tx.put(self.key, value, lease=self.session.lease_id)],
            failure=[tx.get(self.key)],
        )
        if ok:
            self.create_revision = responses[0].response_put.header.revision
        else:
            # Our key exists from an earlier attempt (same lease).
            self.create_revision = responses[0][0][1].create_revision
        while True:
            predecessor = await self._predecessor()
            if predecessor is None:
                return
            await self._wait_deleted(predecessor)

    async def _predecessor(self) -> bytes | None:
        """The key of the candidate just before us; None when we lead."""
        listing = await self.client.get_prefix(self.prefix)
        mine = [kv for kv in listing if kv.key == self.key]
        if not mine:
            raise RuntimeError("election key vanished: the session's lease is gone")
        before = [kv for kv in listing if kv.create_revision < self.create_revision]
        if not before:
            return None
        return max(before, key=lambda kv: kv.create_revision).key

    async def _wait_deleted(self, key: bytes) -> None:
        got = await self.client.get(key)
        if got is None:
            return
        watch = await self.client.watch(key, start_revision=got.mod_revision + 1)
        try:
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
        listing = await self.client.get_prefix(
            self.prefix, sort_order="ascend", sort_target="create"
        )
        first = next(iter(listing), None)
        return first is not None and first.key == self.key

    async def resign(self) -> None:
        """Delete our candidacy (the next candidate takes over at once)."""
        tx = self.client.transactions
        await self.client.transaction(
            compare=[self.leader_compare()], success=[tx.delete(self.key)]
        )

    @staticmethod
    async def leader(client: aetcd.Client, prefix: bytes) -> bytes | None:
        """The current leader's value, or None when there is no candidate."""
        listing = await client.get_prefix(prefix, sort_order="ascend", sort_target="create")
        first = next(iter(listing), None)
        return None if first is None else first.value
