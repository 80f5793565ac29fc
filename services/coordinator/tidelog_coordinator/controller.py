"""This replica's session, registration and controller candidacy.

`ReplicaLifecycle.run()` loops for the life of the process:
1. create a Session (retrying while etcd is unreachable);
2. register this replica under `coordinators/<id>` on the session's lease;
3. campaign for controller; once elected, run the controller duties (offset
   expiry; partition leader election, see leader_election.py; completing
   replica reassignments, see reassignment_driver.py) with every
   write fenced by the election key's create revision;
4. when the session is lost (etcd says the lease is gone, for example after
   an outage longer than the TTL), stop the duties and start again at 1.

A failure in 2 or 3 (etcd unreachable for a moment, a watch cut) retries on
the same session while its lease lives: the campaign finds its own key and
keeps its place. Only a lost session is replaced, and the replaced one is
closed first: a second session would leave the first one's keepalive
running, its lease and election key alive, and that phantom candidate ahead
of this replica would keep every replica from becoming the controller.

Killing the process (even with SIGKILL) lets the lease expire within
`session_ttl_s`; the next candidate, watching its predecessor's key, is then
elected: that bounds the controller fail-over time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import aetcd
from tidelog_server.cancellation import raise_if_cancelling
from tidelog_server.etcd import Election, ElectionKeyLostError, Session, is_unavailable
from tidelog_server.etcd.client import EtcdAccessError
from tidelog_server.etcd.keys import Keys
from tidelog_server.log_flood import RateLimitedLog

from tidelog_coordinator.config import CoordinatorConfig
from tidelog_coordinator.leader_election import LeaderElector
from tidelog_coordinator.offset_store import OffsetStore
from tidelog_coordinator.reassignment_driver import ReassignmentDriver

log = logging.getLogger("tidelog.coordinator.controller")
# Errors these loops repeat (every retry, every pass) log once per interval.
flood = RateLimitedLog(log)

RETRY_DELAY_S = 0.2


class ReplicaLifecycle:
    """Session, registration, election and controller duties of one replica."""

    def __init__(
        self,
        client: aetcd.Client,
        keys: Keys,
        config: CoordinatorConfig,
        host: str,
        port: int,
        offsets: OffsetStore,
    ) -> None:
        self.client = client
        self.keys = keys
        self.config = config
        self.offsets = offsets
        self.value = json.dumps(
            {"id": config.coordinator_id, "host": host, "port": port}, separators=(",", ":")
        ).encode()
        self.session: Session | None = None
        self.election: Election | None = None
        #: True while this replica believes it is the controller.
        self.is_controller = False
        self.elected = asyncio.Event()
        self._closed = False

    async def run(self) -> None:
        while not self._closed:
            try:
                session = await self._live_session()
                if session is None:
                    return  # closed
                await self.client.put(
                    self.keys.coordinator(self.config.coordinator_id),
                    self.value,
                    lease=session.lease_id,
                )
                await self._lead_until_lost(session)
            except asyncio.CancelledError:
                raise
            except ElectionKeyLostError as exc:
                # Our key is gone, so surely our lease too (or someone deleted
                # the key): a new session, at once, rather than waiting for
                # the keepalive to notice.
                log.warning("controller loop: %s; starting a new session", exc)
                if self.session is not None:
                    await self.session.close()
                    self.session = None
            except Exception as exc:
                level = logging.INFO if is_unavailable(exc) else logging.ERROR
                flood.log(
                    level,
                    "controller loop: %s; retrying",
                    exc,
                    # etcd's RBAC refusal says it in words: no traceback.
                    exc_info=level > logging.INFO and not isinstance(exc, EtcdAccessError),
                )
                await asyncio.sleep(RETRY_DELAY_S)
            finally:
                self._step_down()

    async def _live_session(self) -> Session | None:
        """The current session while its lease lives, else a new one (the
        lost one closed first, so no keepalive of ours outlives its use);
        None once close() was called."""
        if self.session is not None and not self.session.lost.is_set():
            return self.session
        if self.session is not None:
            await self.session.close()
            self.session = None
        session = await Session.create(self.client, self.config.session_ttl_s)
        if self._closed:
            # close() ran while the lease was being granted.
            await session.close()
            return None
        self.session = session
        return session

    async def _lead_until_lost(self, session: Session) -> None:
        election = Election(session, self.keys.election)
        self.election = election
        campaign = asyncio.create_task(election.campaign(self.value))
        lost = asyncio.create_task(session.lost.wait())
        try:
            done, _ = await asyncio.wait({campaign, lost}, return_when=asyncio.FIRST_COMPLETED)
            if lost in done:
                return
            campaign.result()  # re-raise a failed campaign
            self.is_controller = True
            self.elected.set()
            log.info("%s is now the controller", self.config.coordinator_id)
            duties = asyncio.create_task(self._duties(election))
            try:
                await asyncio.wait({duties, lost}, return_when=asyncio.FIRST_COMPLETED)
                if duties.done():
                    duties.result()
            finally:
                duties.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await duties
        finally:
            for task in (campaign, lost):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _duties(self, election: Election) -> None:
        elector = LeaderElector(
            self.client,
            self.keys,
            self.config.leader_imbalance_check_interval_ms,
            self.config.etcd_max_txn_ops,
        )
        elections = asyncio.create_task(elector.run(election.leader_compare()))
        driver = ReassignmentDriver(self.client, self.keys)
        reassignments = asyncio.create_task(driver.run(election.leader_compare()))
        try:
            await self._expire_offsets(election)
        finally:
            for task in (elections, reassignments):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _expire_offsets(self, election: Election) -> None:
        interval_s = self.config.offsets_retention_check_interval_ms / 1000
        while True:
            try:
                await self.offsets.expire_offsets(election.leader_compare())
            except Exception as exc:
                raise_if_cancelling(exc)
                if not is_unavailable(exc):
                    flood.exception("expiring offsets failed")
            await asyncio.sleep(interval_s)

    def _step_down(self) -> None:
        if self.is_controller:
            log.info("%s is no longer the controller", self.config.coordinator_id)
        self.is_controller = False
        self.elected.clear()

    async def close(self) -> None:
        """Resign and revoke the session: another replica takes over at once.
        run() then returns instead of starting a new session."""
        self._closed = True
        self._step_down()
        if self.session is not None:
            await self.session.close()
