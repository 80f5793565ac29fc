"""Partition leader election: the controller duty that keeps every partition
led by a live in-sync replica.

One pass (`elect_once`) reads the live brokers, the topics and every
partition state, and for each partition decides:

- its leader is gone (registration vanished) or it has none (-1): the first
  replica, in placement order, that is in the ISR and alive leads, with the
  leader epoch bumped and the ISR cut to live members; no such replica and
  `unclean.leader.election.enable`: the first live replica leads with
  ISR = [it] (what only the ISR had is lost); else the partition stays
  leaderless (leader -1, epoch bumped to fence the old leader, ISR kept, so
  that an ISR member that returns is elected). Who leads is
  `tidelog_server.election_rule`'s, which `tidelog topics describe` reads
  too to call a leaderless partition offline;
- its leader is alive but other ISR members are gone: they leave the ISR at
  once (as KRaft fences a broker that lost its session), so a broker that
  comes back with a torn log cannot be elected before it caught up again;
- preferred leader election (every `leader_imbalance_check_interval_ms`): the
  first replica is alive, in the ISR, and not the leader: it leads again.

A replica whose broker lists the partition among its offline logs (its
registration's `offline_partitions`: a reset or truncation failed part-way,
and the log serves nothing until the broker restarts) counts as gone for
that partition alone, as KRaft's controller treats a replica on a failed log
directory: it is never elected (not even by an unclean election), it leaves
the ISR in the same epoch, and a leader that reports it moves leadership to
another ISR member in a new epoch (or, with none, leaves the partition
leaderless with the ISR kept, so that it leads again once a restart
recovered its log). A broker of an older release lists nothing, which means
nothing is offline.

A replica whose broker lists the partition among its `torn_partitions`
(its log may have lost its tail: the broker was not shut down cleanly, or
recovery cut damage; and it has neither caught up with a leader nor led
since) is not elected either while another ISR member may
return (it may be elected by an unclean election, or when every ISR member
is back and torn: nobody has more), but it stays in the ISR: it catches up
and becomes electable again. Without that, a leader and a torn follower
killed together (the ISR being those two) left the partition leaderless,
the torn follower came back first and was elected as "the best there is",
and the others truncated every acknowledged record above its cut (1.15 M
of 4.5 M in a 300 s soak). With it, the partition waits for the other ISR
member. A broker whose registration says `starting` (it has not hosted its
logs yet, so which are torn is not known) counts as not live for elections
until it rewrites it.

When every ISR member is back and torn (a leader and its followers crashed
together, each cutting its own tail), the one holding the most leads: the
highest (last epoch, log end offset) its broker publishes (`torn_figures`;
tidelog_server.election_rule.most_complete), as Kafka's controller elects
by last epoch and log end (KIP-966), so that the others truncate to the
longest log, not to the deepest cut. A broker of an older release
publishes no figures: the first of them in placement order leads, as
before.

Eligible leader replicas (`PartitionState.elr`, KIP-966): an ISR member
this controller removes (or that an election leaves out) while the ISR is
below the topic's min.insync.replicas stays eligible, as election_rule says
(`next_elr`, `elect_in_sync`): it leads when no untorn ISR member can, and
a torn ISR member waits for it as for an ISR member. Without it, a leader
removed in favour of a follower whose dead process's lease had not yet
expired left that follower the only ISR member; it came back torn, led, and
the others truncated to its cut (2.8 M acknowledged records in a soak).

Every write is a transaction comparing the state key's mod revision (a write
by the leader, such as an ISR change, in between makes the pass skip it; the
next pass sees the new state) and the controller's election key (fencing).
A pass writes its changes up to etcd's --max-txn-ops at a time, as KRaft's
controller appends a broker's fencing as one batch of records: a broker that
led 10,000 partitions dies, and they all have new leaders after ~80
transactions, not 10,000 one after another (~30 s on a busy etcd, during
which the partitions whose only in-sync replica came back stayed offline).
A batch whose transaction fails (a state changed meanwhile) is written
partition by partition. Passes run when the brokers/ prefix changes and
every second otherwise, and soon again after a pass some of whose states
lost to a write made meanwhile (as Kafka's controller retries with the
fresh state): 50 ms later, then 100, 200 and 400 ms while every pass loses
some, then every second again until one writes all it decided. Without
that, such a partition (a dead broker's, whose leader shrank its ISR just
then) waited a second more for its election or ISR change; the controller
watches brokers/ only (a watch on partitions/ would run a pass per ISR
write), and the bound keeps a leader that writes in a tight loop from
making the controller read every state 20 times a second.

Not thread-safe: runs on the coordinator's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import aetcd
from tidelog.errors import InvalidConfigError
from tidelog_server.cancellation import raise_if_cancelling
from tidelog_server.election_rule import LogFigures, elect, elect_in_sync, next_elr
from tidelog_server.etcd import PrefixWatcher, WatchBatch, is_unavailable
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.offline import offline_replicas
from tidelog_server.etcd.records import BrokerRegistration, PartitionState, TopicAssignment
from tidelog_server.log_flood import RateLimitedLog
from tidelog_server.topic_configs import parse_topic_configs

log = logging.getLogger("tidelog.coordinator.election")
# A pass that fails the same way every 0.2 s logs once per interval.
flood = RateLimitedLog(log)

#: A pass also runs this often without any broker change (leader -1
#: partitions of new topics, lost watch events).
PASS_INTERVAL_S = 1.0
#: A pass some of whose states lost to a write made meanwhile (their
#: partitions are decided again from the fresh state) runs again this soon,
#: not a broker change or PASS_INTERVAL_S later.
CONFLICT_REPASS_DELAY_S = 0.05
#: Quick passes in a row, the delay doubling each time (50, 100, 200,
#: 400 ms): then PASS_INTERVAL_S, until a pass loses nothing. A leader
#: writing its state in a tight loop costs at most this many more passes.
CONFLICT_REPASSES_MAX = 4
#: etcd's default --max-txn-ops.
DEFAULT_MAX_TXN_OPS = 128


def decide(
    replicas: list[int],
    state: PartitionState,
    live: set[int],
    unclean: bool,
    preferred: bool,
    restarted: frozenset[int] | set[int] = frozenset(),
    offline: frozenset[int] | set[int] = frozenset(),
    torn: frozenset[int] | set[int] = frozenset(),
    figures: Mapping[int, LogFigures] | None = None,
    min_isr: int = 1,
) -> PartitionState | None:
    """The new state of one partition, or None to leave it (pure; tested alone).

    `restarted`: live brokers registered after this state was written. They
    died and came back since, maybe with a torn log, so they count as gone
    (not in the ISR, not leading) unless nobody else can lead.
    `offline`: live brokers whose replica of this partition is offline
    (see the module doc): gone, for this partition, whatever else happens.
    `torn`: live brokers whose replica of this partition lost a damaged tail
    and has not caught up since (see the module doc): kept in the ISR, not
    elected while an ISR member is still away (an unclean election may).
    `figures`: what each torn replica's log holds (LiveBrokers.
    torn_figures_of): with every ISR member back and torn, the one holding
    the most leads; a replica without figures (an older broker) leaves the
    choice to placement order.
    `min_isr`: the topic's min.insync.replicas (`topic_min_isr`): an ISR
    member removed while the ISR is below it joins the eligible leader
    replicas (`state.elr`; election_rule.next_elr), which may lead as ISR
    members may (election_rule.elect_in_sync).
    """
    if offline:
        live = live - set(offline)
    leader, epoch, isr, version = state.leader, state.leader_epoch, list(state.isr), state.version

    def written(leader: int, epoch: int, new_isr: list[int] | tuple[int, ...]) -> PartitionState:
        elr = next_elr(isr, new_isr, state.elr, min_isr, replicas)
        return PartitionState(leader, epoch, tuple(new_isr), version + 1, elr)

    steady = live - set(restarted)
    live_isr = [b for b in isr if b in steady]
    if leader < 0 or (leader not in steady and not live_isr):
        # Leaderless, or only restarted ISR members left: one of them is the
        # best there is (it leads in a new epoch).
        live_isr = [b for b in isr if b in live]
    if leader >= 0 and leader in steady:
        if (
            preferred
            and replicas
            and replicas[0] != leader
            and replicas[0] in live_isr
            and replicas[0] not in torn
        ):
            return written(replicas[0], epoch + 1, live_isr)
        if live_isr != isr:
            return written(leader, epoch, live_isr)
        return None
    # The rule the describe path states too (election_rule): an ISR member
    # outside the assignment never leads, nor a torn one while another ISR
    # member may still return; with every ISR member back and torn (one
    # replica, or all crashed together), the one whose log holds the most.
    # A reassignment moving leadership elects by the same function. An
    # eligible leader replica (state.elr) holds every acknowledged record
    # too: it leads when no untorn ISR member can, and while one of them is
    # away, a torn ISR member does not (it may return with more).
    elected = elect_in_sync(replicas, isr, live, torn, figures, eligible=live_isr, elr=state.elr)
    if elected is None and unclean:
        # The first live replica, whatever its log (no ISR to choose from).
        elected = elect(replicas, (), live, unclean=True)
    if elected is not None and elected.clean:
        if elected.leader in live_isr:
            return written(elected.leader, epoch + 1, live_isr)
        # From the ELR: it joins the ISR (and so leaves the ELR).
        return written(elected.leader, epoch + 1, [elected.leader, *live_isr])
    if elected is not None:
        # Unclean: what only the ISR had is lost; the new ISR is the leader,
        # and no one else is known to hold every record it has (no ELR).
        return PartitionState(elected.leader, epoch + 1, (elected.leader,), version + 1)
    if leader != -1:
        # Nobody may lead: fence the old leader, keep the ISR and ELR to
        # wait for.
        return replace(state, leader=-1, leader_epoch=epoch + 1, version=version + 1)
    return None


class LeaderElector:
    """Runs election passes while this replica is the controller."""

    def __init__(
        self,
        client: aetcd.Client,
        keys: Keys,
        preferred_interval_ms: int,
        max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
    ) -> None:
        self.client = client
        self.keys = keys
        #: States written per transaction: etcd's --max-txn-ops bounds the
        #: compares (one per state and the controller fence) and the puts.
        self.partitions_per_txn = max(1, max_txn_ops - 1)
        self.preferred_interval_s = preferred_interval_ms / 1000
        self._trigger = asyncio.Event()
        #: The partitions whose new state the last pass decided but did not
        #: write: their state changed after the pass read it (the next pass
        #: decides them again). Empty when the pass found itself deposed.
        self.conflicted: tuple[str, ...] = ()

    async def run(self, fence: Any) -> None:
        """Passes until cancelled; `fence` is the election's leader compare."""
        watcher = PrefixWatcher(self.client, self.keys.brokers, self._on_brokers, name="elector")
        watch = asyncio.create_task(watcher.run())
        last_preferred = time.monotonic()
        wait_s = PASS_INTERVAL_S
        repasses = 0  # quick passes in a row after lost writes
        try:
            while True:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for
                # returns normally when the trigger fires in the same step as
                # a cancel, swallowing it, and stopping the controller's
                # duties then waits for this task forever.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await self._trigger.wait()
                self._trigger.clear()
                wait_s = PASS_INTERVAL_S
                preferred = (
                    self.preferred_interval_s > 0
                    and time.monotonic() - last_preferred >= self.preferred_interval_s
                )
                try:
                    await self.elect_once(fence, preferred)
                    if preferred:
                        last_preferred = time.monotonic()
                    if not self.conflicted:
                        repasses = 0
                    elif repasses < CONFLICT_REPASSES_MAX:
                        wait_s = CONFLICT_REPASS_DELAY_S * 2**repasses
                        repasses += 1
                        log.info(
                            "%s: state changed during the pass; deciding again in %.2f s",
                            _some(self.conflicted),
                            wait_s,
                        )
                except Exception as exc:
                    raise_if_cancelling(exc)
                    if not is_unavailable(exc):
                        flood.exception("leader election pass failed")
                    await asyncio.sleep(0.2)
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    async def _on_brokers(self, batch: WatchBatch) -> None:
        self._trigger.set()

    async def elect_once(self, fence: Any, preferred: bool) -> int:
        """One pass over every partition; returns how many states it wrote
        and records in `conflicted` those it decided but could not write."""
        self.conflicted = ()
        brokers = await read_live_brokers(self.client, self.keys)
        registered = brokers.registered
        live = set(registered) - brokers.starting
        topics = {}
        for kv in await self.client.get_prefix(self.keys.topics):
            assignment = TopicAssignment.decode(kv.value)
            topics[assignment.name] = assignment
        unclean_of: dict[str, bool] = {}
        min_isr_of: dict[str, int] = {}
        changes: list[_Change] = []
        for kv in await self.client.get_prefix(self.keys.all_partition_states):
            tp = self.keys.parse_partition_state_key(kv.key)
            if tp is None:
                continue
            topic = topics.get(tp.topic)
            if topic is None:
                continue
            partition = tp.partition
            replicas = list(topic.replicas[partition]) if partition < len(topic.replicas) else []
            if tp.topic not in unclean_of:
                unclean_of[tp.topic] = _unclean_election(topic)
                min_isr_of[tp.topic] = topic_min_isr(topic)
            state = PartitionState.decode(kv.value)
            restarted = {b for b, rev in registered.items() if rev > kv.mod_revision}
            offline = brokers.offline_of(tp.topic, partition)
            torn = brokers.torn_of(tp.topic, partition)
            new = decide(
                replicas,
                state,
                live,
                unclean_of[tp.topic],
                preferred,
                restarted,
                offline,
                torn,
                brokers.torn_figures_of(tp.topic, partition),
                min_isr_of[tp.topic],
            )
            if new is not None:
                changes.append(_Change(f"{tp.topic}-{partition}", kv, state, new, offline))
        written: list[_Change] = []
        conflicted: list[str] = []
        for start in range(0, len(changes), self.partitions_per_txn):
            decided = changes[start : start + self.partitions_per_txn]
            batch = await self._write(fence, decided)
            if batch is None:
                conflicted = []  # no longer the controller: nothing to retry
                break
            written += batch
            if len(batch) < len(decided):
                landed = {id(change) for change in batch}
                conflicted += [c.name for c in decided if id(c) not in landed]
        self.conflicted = tuple(conflicted)
        for change in written:
            old, new = change.old, change.new
            log.info(
                "%s: leader %s -> %s, epoch %s -> %s, isr %s -> %s%s (live brokers %s%s)",
                change.name,
                old.leader,
                new.leader,
                old.leader_epoch,
                new.leader_epoch,
                list(old.isr),
                list(new.isr),
                f", elr {list(old.elr)} -> {list(new.elr)}" if old.elr or new.elr else "",
                sorted(live),
                f"; offline replicas {sorted(change.offline)}" if change.offline else "",
            )
        return len(written)

    async def _write(self, fence: Any, changes: list[_Change]) -> list[_Change] | None:
        """Write `changes` in one transaction; when a state changed meanwhile
        (the transaction fails), each on its own, so that the others still
        land. Returns those written; None when this replica is no longer the
        controller (the fence failed: nothing more to try)."""
        tx = self.client.transactions
        fences = [] if fence is None else [fence]

        async def write(batch: list[_Change]) -> bool:
            ok, _ = await self.client.transaction(
                compare=fences + [tx.mod(c.kv.key) == c.kv.mod_revision for c in batch],
                success=[tx.put(c.kv.key, c.new.encode()) for c in batch],
                failure=[],
            )
            return bool(ok)

        if await write(changes):
            return changes
        if (
            fences
            and not (await self.client.transaction(compare=fences, success=[], failure=[]))[0]
        ):
            return None
        if len(changes) == 1:
            return []
        return [change for change in changes if await write([change])]


@dataclass(frozen=True, slots=True)
class _Change:
    """One partition's new state, decided from `kv` (its state as read)."""

    name: str
    kv: Any
    old: PartitionState
    new: PartitionState
    #: The partition's offline replicas, as the pass read them.
    offline: frozenset[int] = frozenset()


@dataclass(frozen=True)
class LiveBrokers:
    """The brokers registered in etcd, as one read of their keys shows them:
    what every pass that elects or describes leaders needs of them."""

    #: Broker id -> the create revision of its registration (a broker that
    #: registered after a partition state was written restarted since).
    registered: dict[int, int]
    #: (topic, partition) -> the live brokers whose log of it is offline
    #: (their registrations' `offline_partitions`; a dead broker is in none).
    offline: dict[tuple[str, int], frozenset[int]]
    #: (topic, partition) -> the live brokers whose log of it is torn
    #: (their registrations' `torn_partitions`).
    torn: dict[tuple[str, int], frozenset[int]] = field(default_factory=dict)
    #: Brokers whose registration says `starting` (see the module doc).
    starting: frozenset[int] = frozenset()
    #: (topic, partition) -> broker -> what its torn log holds (their
    #: registrations' `torn_figures`; none from an older broker).
    figures: dict[tuple[str, int], dict[int, LogFigures]] = field(default_factory=dict)

    def torn_figures_of(self, topic: str, partition: int) -> dict[int, LogFigures]:
        """Broker -> what its torn log of `topic`-`partition` holds, for the
        torn replicas whose broker publishes it: what an election among torn
        ISR members compares (the module doc)."""
        return self.figures.get((topic, partition), {})

    def torn_replicas(self, topic: str, partition: int, replicas: Iterable[int]) -> tuple[int, ...]:
        """Those of `replicas` whose log is torn (`torn_of`), in replica
        order, as DescribeTopics reports them: why a partition whose other
        ISR members are down waits leaderless."""
        torn = self.torn_of(topic, partition)
        return tuple(b for b in replicas if b in torn)

    def torn_of(self, topic: str, partition: int) -> frozenset[int]:
        """The live brokers whose log of `topic`-`partition` lost a damaged
        tail and has not caught up since: never elected (the module doc)."""
        return self.torn.get((topic, partition), frozenset())

    def offline_of(self, topic: str, partition: int) -> frozenset[int]:
        """The live brokers whose log of `topic`-`partition` is offline: what
        elections read (dead brokers are `registered`'s business)."""
        return self.offline.get((topic, partition), frozenset())

    def offline_replicas(
        self, topic: str, partition: int, replicas: Iterable[int]
    ) -> tuple[int, ...]:
        """Those of `replicas` that cannot serve, as DescribeTopics reports
        them (Kafka's offline replicas, `tidelog_server.etcd.offline`): a
        broker not registered, or one whose log of it is offline. Reported
        only: elections never read it."""
        logs = self.offline_of(topic, partition)
        return tuple(offline_replicas(replicas, self.registered, logs.__contains__))


async def read_live_brokers(client: Any, keys: Any) -> LiveBrokers:
    """Read every broker registration under `keys.brokers` once."""
    registrations = [
        (BrokerRegistration.decode(kv.value), kv.create_revision)
        for kv in await client.get_prefix(keys.brokers)
    ]
    return LiveBrokers(
        {registration.broker_id: revision for registration, revision in registrations},
        offline_logs(registration for registration, _ in registrations),
        torn_logs(registration for registration, _ in registrations),
        frozenset(
            registration.broker_id for registration, _ in registrations if registration.starting
        ),
        torn_figures(registration for registration, _ in registrations),
    )


def offline_logs(
    registrations: Iterable[BrokerRegistration],
) -> dict[tuple[str, int], frozenset[int]]:
    """(topic, partition) -> the brokers whose log of it is offline, as their
    registrations list them (see the module doc)."""
    return _listed_by(registrations, lambda registration: registration.offline_partitions)


def torn_logs(
    registrations: Iterable[BrokerRegistration],
) -> dict[tuple[str, int], frozenset[int]]:
    """(topic, partition) -> the brokers whose log of it is torn, as their
    registrations list them (see the module doc)."""
    return _listed_by(registrations, lambda registration: registration.torn_partitions)


def torn_figures(
    registrations: Iterable[BrokerRegistration],
) -> dict[tuple[str, int], dict[int, LogFigures]]:
    """(topic, partition) -> broker -> what its torn log of it holds, as the
    registrations publish it (see the module doc)."""
    figures: dict[tuple[str, int], dict[int, LogFigures]] = {}
    for registration in registrations:
        for topic, partition, last_epoch, log_end in registration.torn_figures:
            figures.setdefault((topic, partition), {})[registration.broker_id] = LogFigures(
                last_epoch, log_end
            )
    return figures


def _listed_by(
    registrations: Iterable[BrokerRegistration],
    listed: Callable[[BrokerRegistration], Iterable[tuple[str, int]]],
) -> dict[tuple[str, int], frozenset[int]]:
    """(topic, partition) -> the brokers whose registration's `listed`
    partitions name it."""
    brokers: dict[tuple[str, int], set[int]] = {}
    for registration in registrations:
        for tp in listed(registration):
            brokers.setdefault(tp, set()).add(registration.broker_id)
    return {tp: frozenset(ids) for tp, ids in brokers.items()}


def _some(names: tuple[str, ...], shown: int = 5) -> str:
    """The first `shown` of `names`, for a log line of bounded length."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _unclean_election(topic: TopicAssignment) -> bool:
    try:
        return parse_topic_configs(topic.configs).unclean_leader_election_enable
    except InvalidConfigError:
        # Configs are validated when written; a bad one read back means a
        # hand-edited key: fall back to the safe choice (no unclean election)
        # rather than stop electing leaders.
        log.warning("topic %s has invalid configs; unclean election off", topic.name)
        return False


def topic_min_isr(topic: TopicAssignment) -> int:
    """The topic's own min.insync.replicas, which the eligible leader
    replicas are kept by (`decide`). The coordinator knows no broker's
    default: a topic without its own takes 1 here (no ELR is kept for it by
    the controller's writes, as before ELR), whatever its brokers default
    to. That is the safe side: brokers refuse acks=all below their
    effective min.insync.replicas, never below, so an ELR kept by this one
    holds every acknowledged record; one kept by a larger figure than the
    brokers' would not (its members would miss records acknowledged while
    the ISR was between the two)."""
    try:
        return parse_topic_configs(topic.configs).min_insync_replicas
    except InvalidConfigError:
        # As _unclean_election (its warning says the configs are invalid):
        # 1, the smallest, for the reason above.
        return 1
