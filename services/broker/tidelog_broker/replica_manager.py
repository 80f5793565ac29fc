"""The broker's replicas in cluster mode: the role of every hosted
partition (leader, follower, neither), its leader epoch, ISR and high
watermark; what a leader does when followers fetch (their progress, the HW,
ISR expansion, after checking that the follower is an assigned replica
registered live), ISR shrinking, acks=all waits for the HW, and what a
follower does with what it fetched (append, truncate, reset).

The rules themselves (HW and ISR arithmetic) are in replica_state; the logs
are the LogManager's; etcd is ClusterLink's, which applies roles
(`set_role`) and provides `lease_valid`, `registration_of` and `isr_writer`.
Standalone, no partition has a replication state.

Not thread-safe: everything runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from tidelog import records
from tidelog.errors import (
    NotEnoughReplicasAfterAppendError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
)
from tidelog_server.log_flood import RateLimitedLog

from tidelog_broker.config import BrokerConfig
from tidelog_broker.log_manager import LogManager, TopicPartitionKey
from tidelog_broker.replica_state import PartitionReplication, RegistrationOf, Role
from tidelog_broker.replica_throttle import ReplicationThrottle
from tidelog_broker.storage import Clock, PartitionLog

log = logging.getLogger("tidelog.broker")
# Errors that loops repeat (per partition, per pass) log once per interval.
flood = RateLimitedLog(log)


class ReplicaManager:
    """Roles, ISR and high watermark of the partitions this broker hosts."""

    def __init__(
        self, config: BrokerConfig, clock: Clock, logs: LogManager, *, cluster_mode: bool
    ) -> None:
        self._config = config
        self._clock = clock
        self._cluster_mode = cluster_mode
        self._logs = logs
        # Cluster mode: role, epoch, ISR and HW of every hosted partition.
        self._replication: dict[TopicPartitionKey, PartitionReplication] = {}
        logs.on_partition_closed = self._forget
        #: Cluster mode: False while this broker's etcd lease may have expired;
        #: a leader then refuses writes (no split brain). Set by ClusterLink.
        self.lease_valid: Callable[[], bool] = lambda: True
        #: Cluster mode: the etcd registration revision of a live broker (None:
        #: not registered, so not alive); set by ClusterLink. Replica fetches
        #: and ISR expansion are bound to it.
        self.registration_of: RegistrationOf = lambda _broker_id: None
        #: Cluster mode: whether a broker's registration lists its replica of
        #: a partition offline (broker, topic, partition); set by ClusterLink.
        #: Such a replica never joins the ISR: the controller removed it, and
        #: its progress from before its log went offline must not bring it
        #: back within replica.lag.time.max.ms.
        self.replica_offline: Callable[[int, str, int], bool] = lambda _b, _t, _p: False
        #: Cluster mode: writes a proposed ISR to etcd (fenced), True when
        #: written and False when refused; set by ClusterLink. The list it
        #: gets is the proposal itself (PartitionReplication.propose_isr): once
        #: `proposed_isr` is another object, the proposal has ended.
        self.isr_writer: Callable[[PartitionReplication, list[int]], Awaitable[bool]] | None = None
        self._isr_tasks: set[asyncio.Task[None]] = set()
        #: Called with (old ISR, new ISR) when the ISR of a partition led
        #: here changes (metrics count shrinks and expansions).
        self.on_isr_change: Callable[[list[int], list[int]], None] = lambda _old, _new: None
        #: Cluster mode: the byte rate to replicas being added by a
        #: reassignment (configured by ClusterLink, applied by ReplicaServicer).
        self.throttle = ReplicationThrottle()

    def _forget(self, topic: str, partition: int) -> None:
        self._replication.pop((topic, partition), None)

    def partition_log(self, topic: str, partition: int) -> PartitionLog:
        """A hosted partition's log (LogManager.partition_log)."""
        return self._logs.partition_log(topic, partition)

    async def wait_for_append(self, partitions: list[TopicPartitionKey], timeout_s: float) -> None:
        """LogManager.wait_for_append: followers' long-polls wait for the leader's appends."""
        await self._logs.wait_for_append(partitions, timeout_s)

    def replication(self, topic: str, partition: int) -> PartitionReplication | None:
        """Cluster mode: the role and ISR of a hosted partition (None: unknown)."""
        return self._replication.get((topic, partition))

    def known_leader(self, topic: str, partition: int) -> int:
        """Cluster mode: the leader of a hosted partition as this broker
        applied its state: itself while it leads, the broker it follows, or
        -1 when it knows none (no state applied yet; no live leader; or a
        state naming it that it may not lead on yet, Role.NONE: it serves
        as leader no more than as follower)."""
        replication = self._replication.get((topic, partition))
        if replication is None or replication.role is Role.NONE:
            return -1
        return replication.leader_id

    def leader_replication(
        self, topic: str, partition: int, write: bool
    ) -> PartitionReplication | None:
        """Cluster mode: the partition's state if this broker leads it (and,
        for a write, still holds its etcd lease); else NotLeaderOrFollower.
        Followers serve neither produce nor consumer fetch (Kafka's default)."""
        if not self._cluster_mode:
            return None
        replication = self._replication.get((topic, partition))
        me = self._config.broker_id
        if replication is None or not replication.is_leader:
            leader = "unknown" if replication is None else replication.leader_id
            raise NotLeaderOrFollowerError(
                f"broker {me} does not lead {topic}-{partition} (leader: {leader}): "
                "refresh metadata and ask its leader"
            )
        if write and not self.lease_valid():
            raise NotLeaderOrFollowerError(
                f"broker {me} may have lost its etcd session, so it may no longer lead "
                f"{topic}-{partition}: refresh metadata and retry"
            )
        return replication

    def set_role(
        self,
        topic: str,
        partition: int,
        *,
        role: Role,
        leader_id: int,
        leader_epoch: int,
        replicas: list[int],
        isr: list[int],
        revision: int,
    ) -> PartitionReplication:
        """Cluster mode: apply a hosted partition's state from etcd (its mod
        revision `revision`: required, because a state of unknown revision
        would have to count as newer than any and end an ISR proposal before
        its outcome is applied). Idempotent: the same state again changes nothing. A new epoch or
        role starts afresh (a new leader records its epoch in the log's
        epoch history at its log end offset); an ISR change alone keeps the
        followers' progress and may move the HW, as may the end of an ISR
        proposal (PartitionReplication.maximal_isr)."""
        key = (topic, partition)
        # An offline log may follow or have no leader (the controller moved
        # leadership off it: this broker must stop leading), but never lead:
        # leading needs its log end (StorageError, as before).
        if role is Role.LEADER:
            partition_log = self._logs.partition_log(topic, partition)
        else:
            partition_log = self._logs.hosted_log(topic, partition)
        me = self._config.broker_id
        old = self._replication.get(key)
        if old is not None and old.role is role and old.leader_epoch == leader_epoch:
            old.replicas = list(replicas)
            if old.isr_change_pending and revision > old.proposal_base_revision:
                # The state moved past what the proposal was written
                # against: it is the proposal's outcome, or supersedes it.
                old.end_isr_proposal()
            old.state_revision = revision
            changed = old.isr != isr
            if changed:
                if old.is_leader:
                    self.on_isr_change(old.isr, isr)
                old.isr = list(isr)
            moved = old.is_leader and self._advance_high_watermark(old, partition_log)
            if changed and not moved:  # a move has woken them already
                self._logs.wake(key)
            return old
        state = PartitionReplication(
            topic,
            partition,
            role,
            leader_id,
            leader_epoch,
            list(replicas),
            list(isr),
            since_ms=self._clock.monotonic_ms(),
            # A HW learnt as follower is kept: it never moves backwards here.
            high_watermark=0 if old is None else old.high_watermark,
            state_revision=revision,
        )
        if role is Role.LEADER:
            partition_log.leader_epochs.assign(leader_epoch, partition_log.log_end_offset)
            state.start_leading(me, partition_log.log_end_offset)
            # A log that may have lost its tail at open is no longer torn
            # once it leads: the controller elected it knowing so (ClusterLink
            # applies leadership only of states written after this broker's
            # registration, which lists its torn logs), so none of the ISR
            # could hold more; its log is the reference the others truncate
            # to, and what it acknowledges from now on is on the ISR.
            self._logs.elected_leader(partition_log)
        self._replication[key] = state
        log.info(
            "%s-%d: %s, leader %d, epoch %d, isr %s, log end %d",
            topic,
            partition,
            role.value,
            leader_id,
            leader_epoch,
            isr,
            partition_log.log_end_offset,
        )
        # Waiting acks=all requests and long-polls look at the new role.
        self._logs.wake(key)
        return state

    async def wait_for_high_watermark(
        self, topic: str, partition: int, offset: int, leader_epoch: int, timeout_s: float
    ) -> None:
        """acks=all: return once the HW is past `offset` (the last offset of
        the batches appended in `leader_epoch`) with the ISR at least the
        topic's min.insync.replicas. NotEnoughReplicasAfterAppendError as
        soon as the HW is past it with the ISR below that; RequestTimedOutError
        after timeout_s; NotLeaderOrFollowerError if leadership moved
        meanwhile (the records may or may not survive). All three are
        retriable: the producer sends the batch again.

        The ISR is asked at the end too, not only at the append: a record
        appended with the ISR at min.insync.replicas, and passed by the HW
        only after the ISR shrank below it, is not on the members removed,
        and those stay eligible to lead (PartitionState.elr): acknowledged,
        it could be lost. Such a record is not acknowledged: it is answered
        NotEnoughReplicasAfterAppendError at once, as Kafka's DelayedProduce
        answers NOT_ENOUGH_REPLICAS_AFTER_APPEND, rather than held until the
        ISR is back or the request times out. An idempotent producer's retry
        is a duplicate, answered with the original offsets once the ISR is
        back at min.insync.replicas (refused NOT_ENOUGH_REPLICAS at the
        append until then, then passed here again): a member rejoins only
        with every record below the HW, so those are then on that many.

        The ISR asked is the one applied from etcd, not the maximal ISR
        (Kafka's check): a member whose joining is only proposed may yet be
        refused, and would then be an eligible leader without the record.
        A shrink still proposed keeps its member in the applied ISR, and the
        HW counts that member, so this answers only after a shrink applied."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        key = (topic, partition)
        while True:
            replication = self._replication.get(key)
            if (
                replication is None
                or not replication.is_leader
                or replication.leader_epoch != leader_epoch
            ):
                raise NotLeaderOrFollowerError(
                    f"leadership of {topic}-{partition} moved while waiting for acks=all"
                )
            min_isr = self._logs.partition_log(topic, partition).config.min_insync_replicas
            if replication.high_watermark > offset:
                if len(replication.isr) >= min_isr:
                    return
                raise NotEnoughReplicasAfterAppendError(
                    f"{topic}-{partition}: offset {offset} was written, but the in-sync "
                    f"replicas shrank to {replication.isr} before they confirmed it, below "
                    f"min.insync.replicas {min_isr}: not acknowledged, retry (an idempotent "
                    "producer's retry is answered with the original offsets, another "
                    "producer's may write it twice)"
                )
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise RequestTimedOutError(
                    f"{topic}-{partition}: in-sync replicas {replication.isr} did not confirm "
                    f"offset {offset} within {timeout_s * 1000:.0f} ms (high watermark "
                    f"{replication.high_watermark}, min.insync.replicas {min_isr})"
                )
            await self._logs.wait_for_append([key], remaining)

    def follower_registration(self, replication: PartitionReplication, follower: int) -> int:
        """Leader: the registration revision under which `follower` may fetch
        this partition. Only a replica assigned to it and registered live in
        etcd may: anything else (an id that is not a replica, a dead broker's
        id) gets NotLeaderOrFollowerError naming the replica and partition,
        and never a record (followers read past the HW)."""
        name = f"{replication.topic}-{replication.partition}"
        if follower not in replication.replicas or follower == self._config.broker_id:
            raise NotLeaderOrFollowerError(
                f"replica {follower} is not a follower of {name} (its replicas are "
                f"{replication.replicas}, led by broker {self._config.broker_id})"
            )
        registration = self.registration_of(follower)
        if registration is None:
            raise NotLeaderOrFollowerError(
                f"replica {follower} of {name} is not registered live in etcd: it may fetch "
                "again once its broker has registered"
            )
        return registration

    def on_follower_fetch(
        self, topic: str, partition: int, follower: int, fetch_offset: int
    ) -> tuple[PartitionReplication, PartitionLog]:
        """Leader: a follower fetches from `fetch_offset` (its log end): track
        its progress, move the HW, propose an ISR expansion. Raises
        NotLeaderOrFollowerError when this broker does not lead it or the
        follower may not fetch it (`follower_registration`)."""
        partition_log = self._logs.partition_log(topic, partition)
        replication = self.leader_replication(topic, partition, write=False)
        assert replication is not None
        registration = self.follower_registration(replication, follower)
        leo = partition_log.log_end_offset
        now_ms = self._clock.monotonic_ms()
        replication.on_follower_fetch(follower, fetch_offset, leo, now_ms, registration)
        self._advance_high_watermark(replication, partition_log)
        expanded = replication.isr_to_expand(
            now_ms,
            self._config.replica_lag_time_max_ms,
            lambda r: (
                None if self.replica_offline(r, topic, partition) else self.registration_of(r)
            ),
        )
        if expanded is not None:
            self._propose_isr(replication, expanded)
        return replication, partition_log

    def append_replicated(
        self,
        topic: str,
        partition: int,
        data: bytes,
        leader_high_watermark: int,
        leader_log_end_offset: int | None = None,
    ) -> None:
        """Follower: append batches exactly as the leader stored them.
        `leader_log_end_offset`: the leader's log end when it answered with
        `data` (None from a leader older than that answer field)."""
        partition_log = self._logs.partition_log(topic, partition)
        if data:
            batches = list(records.iter_batches(data, None))
            first = batches[0][1].base_offset
            end = partition_log.log_end_offset
            if first < end == partition_log.log_start_offset:
                # Our log is empty and starts inside the leader's first batch
                # (DeleteRecords moved the leader's log start into a batch, and
                # this replica was reset there or is new): start it at the
                # batch instead, as Kafka's follower does; the leader's log
                # start offset (follow_log_start) then hides what is below.
                # Below our end, and our segments may still hold records
                # below it: reset_to is crash-safe for that too (a crash
                # leaves this empty log or the reset one, never those records).
                partition_log.reset_to(first)
            partition_log.append_replicated(data, batches)
        replication = self._replication.get((topic, partition))
        if replication is not None and not replication.is_leader:
            high_watermark = min(leader_high_watermark, partition_log.log_end_offset)
            replication.high_watermark = max(replication.high_watermark, high_watermark)
            # A log that may have lost its tail is electable again once it
            # holds records of this leader's epoch (so everything the leader
            # had when its epoch began, every record acknowledged before)
            # and reaches the leader's high watermark (all acknowledged since).
            if (
                partition_log.may_have_lost_tail
                and partition_log.leader_epochs.latest_epoch == replication.leader_epoch
            ):
                self._logs.caught_up(partition_log, leader_high_watermark)
            elif partition_log.may_have_lost_tail and leader_log_end_offset is not None:
                # Or once it reaches the leader's log end as of an answer it
                # applied whole: the leader found no divergence up to the
                # fetch offset (else the answer would have said where to
                # truncate), so this log holds every record the leader had.
                # The way out for a partition the leader writes nothing to
                # (no record of its epoch may ever come). Not for a log
                # without an epoch history, whose agreement the leader
                # could not check, unless it is empty.
                checked = partition_log.leader_epochs.latest_epoch >= 0 or (
                    partition_log.log_end_offset == partition_log.log_start_offset
                )
                if checked:
                    self._logs.caught_up(partition_log, leader_log_end_offset)

    def follow_log_start(self, topic: str, partition: int, leader_log_start: int) -> None:
        """Follower: the leader's log now starts at `leader_log_start`
        (DeleteRecords, retention): move ours up as far as our log goes, so
        that records deleted on the leader are deleted here too."""
        partition_log = self._logs.partition_log(topic, partition)
        offset = min(leader_log_start, partition_log.log_end_offset)
        if offset <= partition_log.log_start_offset:
            return
        doomed = partition_log.delete_records_before(offset)
        # Every change to what a read of the log answers wakes its readers
        # (LogManager.wake), the follower's too: cheap, and nothing then
        # depends on followers never being read.
        self._logs.wake((topic, partition))
        if doomed:
            # Unreachable once renamed; a failed unlink is retried by the next
            # open. Not awaited: close waits for it (`unlink_dropped`).
            asyncio.get_running_loop().run_in_executor(None, self._logs.unlink_dropped, doomed)

    def truncate_replica(self, topic: str, partition: int, offset: int) -> int:
        """Follower: drop a divergent suffix from `offset`; the new log end."""
        partition_log = self._logs.partition_log(topic, partition)
        before = partition_log.log_end_offset
        partition_log.truncate_to(offset)
        # Also when nothing was cut: an epoch that wrote nothing up to here
        # (this broker led it briefly) must leave the history, or the next
        # fetch names it again and diverges again.
        partition_log.leader_epochs.truncate_from_end(offset)
        self._logs.wake((topic, partition))  # see follow_log_start
        log.warning(
            "%s-%d: truncated divergent records from offset %d (log end was %d, now %d)",
            topic,
            partition,
            offset,
            before,
            partition_log.log_end_offset,
        )
        return partition_log.log_end_offset

    def reset_replica(self, topic: str, partition: int, offset: int) -> None:
        """Follower: our log ends below the leader's log start offset
        `offset` (retention deleted what we still needed): restart the log
        empty at `offset` (PartitionLog.reset_to)."""
        partition_log = self._logs.partition_log(topic, partition)
        before_start = partition_log.log_start_offset
        before_end = partition_log.log_end_offset
        partition_log.reset_to(offset)
        self._logs.wake((topic, partition))  # see follow_log_start
        log.warning(
            "%s-%d: log (offsets %d to %d) is behind the leader's log start offset %d: "
            "reset to an empty log at offset %d",
            topic,
            partition,
            before_start,
            before_end,
            offset,
            offset,
        )

    def _advance_high_watermark(
        self, replication: PartitionReplication, partition_log: PartitionLog
    ) -> bool:
        """Leader: recompute the HW over the ISR (maximal while a change is
        proposed) and, when it moved, wake everything that waits on it:
        acks=all produces, consumer long-polls and fetch sessions, and
        followers' long-polls (they learn the HW from the answer). Every
        event that may move the HW comes through here. True when it moved."""
        if not replication.advance_high_watermark(
            self._config.broker_id, partition_log.log_end_offset
        ):
            return False
        self._logs.wake((replication.topic, replication.partition))
        return True

    def _propose_isr(self, replication: PartitionReplication, isr: list[int]) -> None:
        if self.isr_writer is None or replication.isr_change_pending:
            return
        proposal = replication.propose_isr(isr)
        task = asyncio.ensure_future(self._write_isr(replication, proposal))
        self._isr_tasks.add(task)
        task.add_done_callback(self._isr_tasks.discard)

    async def _write_isr(self, replication: PartitionReplication, proposal: list[int]) -> None:
        assert self.isr_writer is not None
        written = False
        try:
            written = await self.isr_writer(replication, proposal)
        except asyncio.CancelledError:
            # stop_isr_writes: the write may have reached etcd, and nothing
            # will settle it now. The proposal stands, so the HW keeps
            # waiting for its replicas while the broker stops.
            raise
        except Exception:
            flood.exception(
                "writing ISR %s of %s-%d failed",
                proposal,
                replication.topic,
                replication.partition,
            )
        # Nothing changed in etcd: a later check may propose again. A
        # written change stays proposed until the watch brings it back
        # (set_role): till then the HW counts its replicas.
        if not written and replication.end_isr_proposal(proposal):
            self._proposal_ended(replication)

    async def stop_isr_writes(self) -> None:
        """The broker stops: cancel the ISR writes under way (before its
        registration goes, so that none is sent after it) and wait for them
        to end. Their proposals stand (see _write_isr); writes proposed
        later are refused by the writer, whose lease is no longer valid."""
        tasks = list(self._isr_tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _proposal_ended(self, replication: PartitionReplication) -> None:
        """A proposal that was not written ended: the HW no longer waits for
        the replicas it would have added, and may move over the ISR alone at
        once. Nothing else may come to move it (no appends, no follower
        fetching: the joining replica may be the one that just stopped), and
        acks=all produces and long-polls would wait for nothing."""
        key = (replication.topic, replication.partition)
        # A state replaced meanwhile (a new role or epoch; the partition
        # closed) is no one's any more: its successor keeps its own HW.
        if self._replication.get(key) is replication and replication.is_leader:
            self._advance_high_watermark(replication, self._logs.partition_log(*key))

    async def run_isr_checks(self) -> None:
        """Leader: shrink the ISR of followers lagging for replica.lag.time.max.ms."""
        lag_ms = self._config.replica_lag_time_max_ms
        interval_s = max(0.05, lag_ms / 2000)
        me = self._config.broker_id
        while True:
            await asyncio.sleep(interval_s)
            now_ms = self._clock.monotonic_ms()
            for replication in list(self._replication.values()):
                if not replication.is_leader:
                    continue
                shrunk = replication.isr_to_shrink(me, now_ms, lag_ms)
                if shrunk is not None:
                    log.info(
                        "%s-%d: followers %s lag more than %d ms; shrinking the ISR to %s",
                        replication.topic,
                        replication.partition,
                        sorted(set(replication.isr) - set(shrunk)),
                        lag_ms,
                        shrunk,
                    )
                    self._propose_isr(replication, shrunk)

    def high_watermark(self, partition_log: PartitionLog) -> int:
        """What consumers may read up to: the smallest log end offset of the
        in-sync replicas (replicated partitions), else the log end."""
        replication = self._replication.get((partition_log.topic, partition_log.partition))
        if replication is None:
            return partition_log.log_end_offset
        return min(replication.high_watermark, partition_log.log_end_offset)
