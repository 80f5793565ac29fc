"""A DescribeTopics answer completed with what only each partition's leader
knows: its log figures (log start and end offsets, high watermark, size on
disk, segment count), for the services that answer DescribeTopics from the
coordinator's placement (a broker in cluster mode, the gateway).

`complete_from_leaders` asks every leader once, all at the same time, for
the topics it leads (the caller's `ask`: a broker answers for itself from its
own logs, any other leader is called with `tidelog-local`). A partition whose
figures could not be had keeps them at -1 (unknown, as Kafka says it) and
gets `PartitionDescription.error` naming its leader and what happened:

- no leader (-1), or a leader that is not live (no registration, so no
  address), and no replica the controller may elect
  (tidelog_server.election_rule): every ISR member and every eligible
  leader replica (`PartitionDescription.eligible_leader_replicas`, KIP-966)
  is offline (`PartitionDescription.offline_replicas`: its broker is not
  registered, or it lists its log offline) or not one of the replicas
  (never elected), and no unclean election can pick another replica. The
  partition is offline (Kafka's offline partition): waiting for an
  election does not bring it back, one of those replicas must
  (`offline_partition_error`). STORAGE_ERROR when each of them is a live
  broker's offline log (the disk must be fixed and the broker restarted:
  what its leader answered while it still led); NOT_LEADER_OR_FOLLOWER,
  Kafka's LEADER_NOT_AVAILABLE, when a broker of one of them is down (it
  leads again once started) or one is not a replica (a reassignment must
  add it back). The message names each and the remedy either way;
- no leader (-1) otherwise (an election is due): NOT_LEADER_OR_FOLLOWER,
  retriable; when ISR members or eligible leader replicas are torn
  (`PartitionDescription.torn_replicas`: their log lost a damaged tail at
  their restart) while others of them are not, the message says that the
  torn ones are not elected while the others may return, naming both
  (`_torn_wait`);
- a leader that is not live otherwise: NOT_LEADER_OR_FOLLOWER, retriable;
- a leader that gave no answer of its own (tidelog_server.forwarding.
  unanswered: dropped the call, unavailable, past the deadline):
  NOT_LEADER_OR_FOLLOWER, or REQUEST_TIMED_OUT past the deadline, retriable;
- a leader that refused the call: the code it refused with;
- a leader whose own log of the partition is offline (a storage failure,
  or it could not be opened: it is about to lose the leadership): the
  STORAGE_ERROR it answers for it, naming it and why;
- a leader whose answer leaves the partition out (it does not host it, or
  not yet): NOT_LEADER_OR_FOLLOWER, retriable;
- a leader whose answer does not name itself as the partition's leader
  (its `leader_id` is the leader it knows: another broker, or -1 when it
  knows none): the caller's placement lags an election, or the broker has
  not taken up its leadership yet, so its figures are a follower's, not the
  leader's: NOT_LEADER_OR_FOLLOWER, retriable, naming the leader it knows.
  A broker older than that field's meaning names itself for every replica
  it hosts: its figures are taken as before.

The topic stays good: one leader's outage does not fail the description of
the other partitions, nor of the topic.

`leader_call_timeout` is how long each leader may take: the service's own
cap, or less when the client's call has less time left, so that a leader
past it costs its partitions (REQUEST_TIMED_OUT) and not the whole answer
(the client's DEADLINE_EXCEEDED).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
import grpc.aio
from tidelog.errors import error_from_rpc
from tidelog.v1 import admin_pb2, common_pb2

from tidelog_server.election_rule import elect, elect_in_sync
from tidelog_server.forwarding import LOCAL_METADATA, unanswered

#: What a PartitionDescription takes from its leader; -1 when unknown.
FIGURES = ("log_start_offset", "log_end_offset", "high_watermark", "size_bytes", "segment_count")

#: The topic config that lets the controller elect a replica out of the ISR.
UNCLEAN_ELECTION = "unclean.leader.election.enable"
#: Where an operator reads what to do about an offline partition: the
#: runbook of offline logs, or, when only brokers are down, where offline
#: partitions are described.
OFFLINE_LOG_RUNBOOK = 'see docs/operations.md, "A partition\'s log goes offline (STORAGE_ERROR)"'
HEALTH_RUNBOOK = 'see docs/operations.md, "Is the cluster healthy?"'
#: Where an operator reads about replicas whose log may have lost its tail.
TORN_RUNBOOK = 'see docs/operations.md, "Torn replicas after a crash"'

#: What `leader_call_timeout` leaves of the client's time for the answer to
#: be completed and reach it once the leaders' calls have ended.
ANSWER_MARGIN_S = 0.25

#: `ask(leader_id, address, request)`: the leader's own DescribeTopics answer
#: for `request.names` (raises grpc.aio.AioRpcError when the call fails).
AskLeader = Callable[
    [int, str, admin_pb2.DescribeTopicsRequest], Awaitable[admin_pb2.DescribeTopicsResponse]
]


def ask_over_grpc(stub_of: Callable[[str], Any], timeout_s: float) -> AskLeader:
    """The `ask` of a service that calls each leader: its DescribeTopics,
    through `stub_of(address)` (an AdminStub), with `tidelog-local` so that
    the leader answers from its own logs, within `timeout_s`."""

    async def ask(
        leader: int, address: str, sub: admin_pb2.DescribeTopicsRequest
    ) -> admin_pb2.DescribeTopicsResponse:
        answer: admin_pb2.DescribeTopicsResponse = await stub_of(address).DescribeTopics(
            sub, timeout=timeout_s, metadata=LOCAL_METADATA
        )
        return answer

    return ask


def leader_call_timeout(context: grpc.aio.ServicerContext, cap_s: float) -> float:
    """The deadline of each leader's call for the client call of `context`:
    `cap_s`, or the client's remaining time less ANSWER_MARGIN_S when that
    is shorter (never less than half the remaining time: a client with a
    very short deadline still gives its leaders some)."""
    remaining = context.time_remaining()
    if remaining is None:  # the client set no deadline
        return cap_s
    return max(0.0, min(cap_s, max(remaining - ANSWER_MARGIN_S, remaining / 2)))


async def complete_from_leaders(
    response: admin_pb2.DescribeTopicsResponse,
    address_of: Callable[[int], str | None],
    ask: AskLeader,
) -> None:
    """Fill each partition of `response` with its leader's figures, or with
    -1 and the error saying why they are unknown (module doc). `address_of`
    gives a live broker's address (None when it is not live)."""
    names_by_leader: dict[int, set[str]] = {}
    for topic in response.topics:
        for partition in topic.partitions:
            if partition.leader_id >= 0:
                names_by_leader.setdefault(partition.leader_id, set()).add(topic.name)
    addresses = {leader: address_of(leader) for leader in names_by_leader}
    asked = [(leader, address) for leader, address in addresses.items() if address is not None]
    outcomes = await asyncio.gather(
        *(_ask_one(ask, leader, address, names_by_leader[leader]) for leader, address in asked)
    )
    answers: dict[int, dict[tuple[str, int], admin_pb2.PartitionDescription]] = {}
    failures: dict[int, common_pb2.Error] = {}
    for (leader, address), outcome in zip(asked, outcomes, strict=True):
        if isinstance(outcome, grpc.aio.AioRpcError):
            failures[leader] = _call_error(outcome, leader, address)
        else:
            answers[leader] = {
                (topic.name, p.partition): p for topic in outcome.topics for p in topic.partitions
            }
    for topic in response.topics:
        for partition in topic.partitions:
            leader = partition.leader_id
            where = f"{topic.name}-{partition.partition}"
            found = answers.get(leader, {}).get((topic.name, partition.partition))
            if found is not None and found.leader_id != leader:
                # Its own answer names another leader, or none: the caller's
                # placement lags an election (or the broker has not applied
                # it yet). Its figures are a follower's, not the leader's.
                unknown(partition, _not_leading_error(where, leader, addresses[leader], found))
                continue
            if found is not None and found.error.code != common_pb2.NONE:
                # The leader's own log cannot tell (offline: STORAGE_ERROR).
                unknown(partition, found.error)
                continue
            if found is not None:
                for name in FIGURES:
                    setattr(partition, name, getattr(found, name))
                partition.ClearField("error")
                continue
            offline = (
                offline_partition_error(topic, partition, address_of)
                if leader < 0 or addresses[leader] is None
                else None
            )
            if offline is not None:
                error = offline
            elif leader < 0:
                error = _error(
                    common_pb2.NOT_LEADER_OR_FOLLOWER,
                    f"{where} has no leader right now (replicas {_ids(partition.replicas)})"
                    f"{_torn_wait(partition)}: its log figures are unknown; retry",
                )
            elif (at := addresses[leader]) is None:
                error = _error(
                    common_pb2.NOT_LEADER_OR_FOLLOWER,
                    f"{where}: its leader, broker {leader}, is not live (not registered): "
                    "its log figures are unknown; retry",
                )
            elif leader in failures:
                failure = failures[leader]
                error = _error(failure.code, f"{where}: {failure.message}")
            else:
                error = _error(
                    common_pb2.NOT_LEADER_OR_FOLLOWER,
                    f"{where}: its leader, broker {leader} at {at}, answered without it "
                    "(it does not host it, or not yet): its log figures are unknown; retry",
                )
            unknown(partition, error)


def _torn_wait(partition: admin_pb2.PartitionDescription) -> str:
    """Why a leaderless partition with torn ISR members or eligible leader
    replicas waits, as a clause of its error ("" when none is torn, or all
    of them are): the torn ones are not elected while the others may
    return with more (election_rule.elect_in_sync)."""
    members = _electable(partition)
    torn = [b for b in members if b in partition.torn_replicas]
    others = [b for b in members if b not in partition.torn_replicas]
    if not torn or not others:
        return ""
    lost = (
        "may have lost the tail of its log"
        if len(torn) == 1
        else "may have lost the tails of their logs"
    )
    isr = set(partition.isr)
    return (
        f"; {_members(torn, isr)} {lost} at restart and {'is' if len(torn) == 1 else 'are'} "
        f"not elected while {_members(others, isr)} may return (start "
        f"{'it' if len(others) == 1 else 'them'} again; {TORN_RUNBOOK})"
    )


def _electable(partition: admin_pb2.PartitionDescription) -> list[int]:
    """The ISR members, then the eligible leader replicas that are not in
    it: whom a clean election picks from (election_rule.elect_in_sync)."""
    isr = list(partition.isr)
    return isr + [b for b in partition.eligible_leader_replicas if b not in isr]


def _members(ids: Sequence[int], isr: set[int]) -> str:
    """`ids` named with their role: "in-sync broker 1", "broker 3 (eligible
    leader replica)", or both joined by "and"."""
    in_sync = [b for b in ids if b in isr]
    eligible = [b for b in ids if b not in isr]
    named = [f"in-sync {_brokers(in_sync)}"] if in_sync else []
    if eligible:
        role = "eligible leader replica" if len(eligible) == 1 else "eligible leader replicas"
        named.append(f"{_brokers(eligible)} ({role})")
    return " and ".join(named)


def _not_leading_error(
    where: str, leader: int, address: str | None, found: admin_pb2.PartitionDescription
) -> common_pb2.Error:
    """The error of a partition whose leader in the placement, `leader`,
    answered for its own replica naming another leader or none."""
    knows = (
        f"it follows broker {found.leader_id}"
        if found.leader_id >= 0
        else "it knows no leader right now"
    )
    return _error(
        common_pb2.NOT_LEADER_OR_FOLLOWER,
        f"{where}: broker {leader} at {address}, its leader as known here, does not lead "
        f"it by its own answer ({knows}): the leadership moved, or the broker has not taken "
        "it up yet; its log figures are unknown; retry",
    )


def offline_partition_error(
    topic: admin_pb2.TopicDescription,
    partition: admin_pb2.PartitionDescription,
    address_of: Callable[[int], str | None],
) -> common_pb2.Error | None:
    """The error of `partition` (of `topic`, with its effective configs)
    when no replica can lead it until an operator acts (module doc), or None
    when the controller may still elect one.

    Whether a replica may lead is tidelog_server.election_rule's, the rule
    the controller elects by: a replica can serve unless it is among
    `partition.offline_replicas`; an eligible leader replica
    (`partition.eligible_leader_replicas`) may lead as an ISR member may.
    A torn one (`partition.torn_replicas`) is not offline for good: it leads
    once the others are back, or every one of them is back and torn
    (`_torn_wait` says so). `address_of` tells a down broker (None) from a
    live one whose log is offline, for the message."""
    isr = list(partition.isr)
    if not isr:
        # No state yet (a topic just created: the controller has not elected
        # yet): its first leader is due.
        return None
    replicas = list(partition.replicas)
    offline = set(partition.offline_replicas)
    # A server older than offline_replicas lists none: all can serve.
    others = [b for b in replicas if b not in offline]
    elr = [b for b in partition.eligible_leader_replicas if b not in isr]
    unclean = topic.configs.get(UNCLEAN_ELECTION) == "true"
    # No torn replicas here: they wait, they are not offline for good.
    if elect_in_sync(replicas, isr, others, (), elr=elr) is not None:
        return None  # an ISR member leads, or else an eligible leader replica
    if elect(replicas, (), others, unclean) is not None:
        return None  # an unclean election picks one of `others`
    members = _electable(partition)
    # A member outside the assignment (a hand-edited state) is never
    # elected, however well it serves: a reassignment that adds it back is.
    outside = [b for b in members if b not in replicas]
    down = {b for b in members if b in replicas and address_of(b) is None}

    def cause(b: int) -> str:
        if b in outside:
            return "not one of its replicas, never elected"
        return "down (not registered)" if b in down else "its log is offline"

    def role(b: int) -> str:
        return "" if b in isr else " (eligible leader replica)"

    causes = "; ".join(f"broker {b}{role(b)}: {cause(b)}" for b in members)
    log_offline = [b for b in members if b in replicas and b not in down]
    remedies = []
    if log_offline:
        them = "them" if len(log_offline) > 1 else "it"
        remedies.append(f"fix the disk of {_brokers(log_offline)} and restart {them}")
    if down:
        remedies.append(f"start {_brokers(sorted(down))} again")
    if outside:
        remedies.append(f"reassign the partition to include {_brokers(outside)}")
    if others:
        no_other = f"{UNCLEAN_ELECTION} is false"
        holders = "in-sync and eligible leader replicas" if elr else "in-sync replicas"
        remedies.append(
            f"or set {UNCLEAN_ELECTION}=true on topic {topic.name!r} to let "
            f"{_brokers(others)} lead, losing the records only the {holders} have"
        )
    else:
        no_other = "no other replica can either"
    # STORAGE_ERROR only when the disks alone keep it down: a down broker
    # leads again once started (by hand or by its supervisor). Both are
    # retriable in the SDK, as Kafka's KAFKA_STORAGE_ERROR and
    # LEADER_NOT_AVAILABLE are, and neither makes a client describe again:
    # describe_topics returns a partition's error, it retries nothing for it.
    # Not a new ErrorCode: an SDK older than it fails the whole describe on
    # an enum value it does not know (error_from_code raises ValueError).
    code = common_pb2.NOT_LEADER_OR_FOLLOWER if down or outside else common_pb2.STORAGE_ERROR
    return _error(
        code,
        f"{topic.name}-{partition.partition} is offline: no in-sync "
        f"{'or eligible leader ' if elr else ''}replica can serve "
        f"({causes}) and {no_other}, so it has no leader until one of them is back: "
        f"{'; '.join(remedies)} ({OFFLINE_LOG_RUNBOOK if log_offline else HEALTH_RUNBOOK}); "
        "its log figures are unknown",
    )


def unknown(partition: admin_pb2.PartitionDescription, error: common_pb2.Error) -> None:
    """The partition's figures are unknown (-1), for the reason `error` gives."""
    for name in FIGURES:
        setattr(partition, name, -1)
    partition.error.CopyFrom(error)


async def _ask_one(
    ask: AskLeader, leader: int, address: str, names: set[str]
) -> admin_pb2.DescribeTopicsResponse | grpc.aio.AioRpcError:
    try:
        return await ask(leader, address, admin_pb2.DescribeTopicsRequest(names=sorted(names)))
    except grpc.aio.AioRpcError as exc:
        return exc


def _call_error(exc: grpc.aio.AioRpcError, leader: int, address: str) -> common_pb2.Error:
    """The error for every partition whose leader failed the call."""
    upstream = f"leader broker {leader} at {address}"
    reason = unanswered(exc, upstream)
    if reason is None:
        # Its own refusal (not authorized, say): a retry would only repeat it.
        refusal = error_from_rpc(exc, address=address)
        return _error(
            common_pb2.ErrorCode.Value(refusal.code_name),
            f"{upstream} refused the call ({refusal.code_name}: {refusal.message}): "
            "its log figures are unknown",
        )
    code = (
        common_pb2.REQUEST_TIMED_OUT
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        else common_pb2.NOT_LEADER_OR_FOLLOWER
    )
    return _error(code, f"{reason}: its log figures are unknown; retry")


def _error(code: common_pb2.ErrorCode.ValueType, message: str) -> common_pb2.Error:
    return common_pb2.Error(code=code, message=message)


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(map(str, ids)) or "none"


def _brokers(ids: Sequence[int]) -> str:
    return f"broker {ids[0]}" if len(ids) == 1 else f"brokers {_ids(ids)}"
