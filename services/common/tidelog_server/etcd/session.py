"""`Session`: a lease kept alive for the life of a process, like etcd's concurrency.Session.

Everything ephemeral a replica writes (its coordinator registration, its
election candidacy) is bound to its session's lease, so it vanishes when the
process dies. The keepalive refreshes every TTL/3, each refresh answered
within TTL/3 or abandoned (with several etcd members the client then moves to
the next one, well before the lease expires). While etcd is unreachable
the session keeps trying: the lease may well survive (etcd restarts extend
every lease by a full TTL), and nothing can be written meanwhile anyway. The
session is `lost` only when etcd says the lease is gone; the owner then
builds a new session and re-creates its keys.

Not thread-safe: use from one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aetcd

from tidelog_server.cancellation import raise_if_cancelling
from tidelog_server.etcd.client import ETCD_CALL_TIMEOUT_S, EtcdClient, is_unavailable

log = logging.getLogger("tidelog.etcd.session")

# etcd refuses leases shorter than about 1.5 s (its minimum TTL follows
# from the election timeout); 2 s is the shortest that always works.
MIN_TTL_S = 2


class Session:
    """A lease and its keepalive task. Create with `await Session.create(...)`."""

    def valid(self) -> bool:
        """True while the lease is surely alive (not lost, not past valid_until)."""
        return not self.lost.is_set() and asyncio.get_running_loop().time() < self.valid_until

    def __init__(self, client: aetcd.Client, lease_id: int, ttl_s: int) -> None:
        self.client = client
        self.lease_id = lease_id
        self.ttl_s = ttl_s
        #: Set once etcd reports the lease expired or revoked.
        self.lost = asyncio.Event()
        #: Event-loop time before which the lease cannot have expired: TTL
        #: after the last grant or refresh was *sent* (etcd started its clock
        #: later). A broker leads only until then (no split brain).
        self.valid_until = asyncio.get_running_loop().time() + ttl_s
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def create(cls, client: aetcd.Client, ttl_s: int) -> Session:
        ttl_s = max(MIN_TTL_S, int(ttl_s))
        sent = asyncio.get_running_loop().time()
        lease = await client.lease(ttl_s)
        session = cls(client, lease.id, ttl_s)
        session.valid_until = sent + ttl_s
        session._task = asyncio.create_task(session._keepalive(), name=f"lease-{lease.id:x}")
        return session

    async def _keepalive(self) -> None:
        interval_s = self.ttl_s / 3
        while True:
            await asyncio.sleep(interval_s)
            sent = asyncio.get_running_loop().time()
            try:
                reply = await self._refresh()
            except Exception as exc:
                raise_if_cancelling(exc)
                if not is_unavailable(exc):
                    log.exception("refreshing lease %x failed", self.lease_id)
                # Retry sooner than the period: one missed refresh must not
                # cost the lease.
                interval_s = 0.2
                continue
            interval_s = self.ttl_s / 3
            if reply is None or reply.TTL <= 0:
                log.warning("session lease %x is gone (expired or revoked)", self.lease_id)
                self.lost.set()
                return
            self.valid_until = sent + min(self.ttl_s, reply.TTL)

    async def _refresh(self) -> Any:
        if isinstance(self.client, EtcdClient):
            # Answered within a third of the TTL or abandoned: the client then
            # fails over, and the next member still gets the refresh in time.
            timeout_s = min(ETCD_CALL_TIMEOUT_S, max(0.5, self.ttl_s / 3))
            return await self.client.refresh_lease(self.lease_id, timeout=timeout_s)
        return await self.client.refresh_lease(self.lease_id)

    async def close(self) -> None:
        """Stop the keepalive and revoke the lease (its keys vanish now)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self.lost.is_set():
            self.lost.set()
            try:
                await self.client.revoke_lease(self.lease_id)
            except Exception as exc:
                # The lease then expires by itself after its TTL.
                log.warning("revoking lease %x failed: %s", self.lease_id, exc)
