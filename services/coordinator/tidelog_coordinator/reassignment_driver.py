"""The controller duty that completes replica reassignments.

A pass reads every topic record with a reassignment in progress and each
such partition's state; a partition whose target replicas are all in the ISR
(`reassignment.is_complete`) gets, in one transaction, its replicas set to the
target, the reassignment removed, and its state cut to the target (a leaving
leader replaced by an in-sync target replica, in a new epoch; by the
controller's rule, so never by one whose log may have lost its tail while
another ISR member may have more: then the move waits, logged once, and a
later pass completes it). The
transaction compares the topic record's and the state's mod revisions and
the controller's election key, so it never overwrites a change made
meanwhile (an ISR change, an election, a cancel) and a deposed controller
cannot write: the next pass sees the new state.

A coordinator that dies mid-reassignment loses nothing: the reassignment
lives in etcd, and the next controller's driver carries on from there.

Not thread-safe: runs on the coordinator's event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import aetcd
from tidelog_server.cancellation import raise_if_cancelling
from tidelog_server.etcd import is_unavailable
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import PartitionState, TopicAssignment
from tidelog_server.log_flood import RateLimitedLog

from tidelog_coordinator import reassignment as rules
from tidelog_coordinator.leader_election import read_live_brokers, topic_min_isr

log = logging.getLogger("tidelog.coordinator.reassignment")
flood = RateLimitedLog(log)

#: How often a pass runs (a reassignment completes at most this long after
#: its last replica joined the ISR).
PASS_INTERVAL_S = 0.5


class ReassignmentDriver:
    """Completes reassignments while this replica is the controller."""

    def __init__(self, client: aetcd.Client, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        #: The partitions whose move waits for a leader (logged once, when
        #: it starts waiting): their target replicas are all in sync, but
        #: none may lead yet (`rules.state_for_replicas` gave None).
        self.waiting: set[tuple[str, int]] = set()

    async def run(self, fence: Any) -> None:
        """Passes until cancelled; `fence` is the election's leader compare."""
        while True:
            try:
                await self.complete_once(fence)
            except Exception as exc:
                raise_if_cancelling(exc)
                if not is_unavailable(exc):
                    flood.exception("reassignment pass failed")
            await asyncio.sleep(PASS_INTERVAL_S)

    async def complete_once(self, fence: Any) -> int:
        """One pass; returns how many partitions it completed."""
        moving = []
        for kv in await self.client.get_prefix(self.keys.topics):
            topic = TopicAssignment.decode(kv.value)
            if topic.reassignments:
                moving.append((topic, kv.mod_revision))
        if not moving:
            return 0
        brokers = await read_live_brokers(self.client, self.keys)
        # A broker still opening its logs has not said which are torn: not
        # live for elections until it has (leader_election).
        live = set(brokers.registered) - brokers.starting
        done = 0
        waiting: set[tuple[str, int]] = set()
        for topic, topic_revision in moving:
            # One transaction per partition: each compares the topic record's
            # revision that the previous one wrote (so a change by anyone
            # else in between stops the topic until the next pass).
            for partition, reassignment in sorted(topic.reassignments.items()):
                state_key = self.keys.partition_state(topic.name, partition)
                got = await self.client.get(state_key)
                if got is None:
                    continue
                state = PartitionState.decode(got.value)
                if not rules.is_complete(reassignment, state):
                    continue
                # A replica whose log is offline never leads, nor a torn one
                # while another ISR member may have more (leader_election).
                offline = brokers.offline_of(topic.name, partition)
                torn = brokers.torn_of(topic.name, partition)
                new_state = rules.state_for_replicas(
                    reassignment.target,
                    state,
                    live - offline,
                    torn,
                    brokers.torn_figures_of(topic.name, partition),
                    topic_min_isr(topic),
                )
                if new_state is None:
                    # Wait (the next pass decides again): a target replica
                    # catches up, or an ISR member that is away returns.
                    waiting.add((topic.name, partition))
                    if (topic.name, partition) not in self.waiting:
                        log.info(
                            "%s-%d: reassignment waits: leader %d leaves, and none of the "
                            "target replicas %s may lead yet (isr %s, torn %s, not live %s)",
                            topic.name,
                            partition,
                            state.leader,
                            list(reassignment.target),
                            list(state.isr),
                            sorted(torn),
                            sorted(b for b in state.isr if b not in live - offline),
                        )
                    continue
                replicas = list(topic.replicas)
                replicas[partition] = reassignment.target
                reassignments = dict(topic.reassignments)
                del reassignments[partition]
                completed = dataclasses.replace(
                    topic,
                    replicas=tuple(replicas),
                    reassignments=reassignments,
                    version=topic.version + 1,
                )
                tx = self.client.transactions
                topic_key = self.keys.topic(topic.name)
                success = [tx.put(topic_key, completed.encode())]
                if new_state is not state:
                    success.append(tx.put(state_key, new_state.encode()))
                ok, responses = await self.client.transaction(
                    compare=[
                        fence,
                        tx.mod(topic_key) == topic_revision,
                        tx.mod(state_key) == got.mod_revision,
                    ],
                    success=success,
                    failure=[],
                )
                if not ok:
                    # The topic or the state changed: read again next pass
                    # (its partitions not reached yet keep their waiting).
                    waiting |= {w for w in self.waiting if w[0] == topic.name}
                    break
                topic = completed
                topic_revision = responses[0].response_put.header.revision
                done += 1
                log.info(
                    "%s-%d: reassignment complete: replicas %s -> %s, leader %d -> %d, isr %s",
                    topic.name,
                    partition,
                    list(reassignment.original),
                    list(reassignment.target),
                    state.leader,
                    new_state.leader,
                    list(new_state.isr),
                )
        # Partitions that stopped waiting (completed, cancelled, or not
        # complete any more) log again if they wait again.
        self.waiting = waiting
        return done
