"""The rules of a partition's replica move (pure; tested alone).

A reassignment changes a partition's replicas from `original` to `target` in
two steps, each one etcd transaction that writes the topic record and the
partition state together (so brokers never see one without the other):

1. start (`start`): the replicas become target + (original - target); the
   adding replicas host the log and fetch from the leader (throttled), and
   the leader lets them into the ISR once they caught up;
2. complete (`is_complete`, then `state_for_replicas(target)`), by the
   controller: once every target replica is in the ISR, the replicas become
   the target, the ISR is cut to it, and if the leader is leaving, the first
   target replica that is alive, in the ISR and not torn leads in a new
   epoch (the controller's rule, election_rule.elect_in_sync: a replica
   whose log may have lost its tail at a restart leads only when every ISR
   member is back and torn, the one holding the most; else nobody does, and
   the move waits until the torn ones caught up with the leader).

Cancel restores `original` the same way (`state_for_replicas(original)`).
No step removes a replica before the replicas that stay hold everything the
ISR acknowledged: the ISR only ever shrinks to members of it, which have
every record up to the high watermark.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from tidelog.errors import InvalidRequestError
from tidelog_server.election_rule import LogFigures, elect_in_sync, next_elr
from tidelog_server.etcd.records import PartitionState, Reassignment

#: Upper bound of a target replica list (also bounded by the live brokers).
MAX_REPLICAS = 64


def check_target(name: str, target: Sequence[int], live: Collection[int]) -> None:
    """Refuse a target replica list that is too long, names a broker twice or
    names a broker that is not live; InvalidRequestError says which."""
    if len(target) > MAX_REPLICAS:
        raise InvalidRequestError(f"{name}: {len(target)} target replicas; at most {MAX_REPLICAS}")
    if len(set(target)) != len(target):
        raise InvalidRequestError(f"{name}: target replicas {list(target)} name a broker twice")
    unknown = [b for b in target if b not in live]
    if unknown:
        raise InvalidRequestError(
            f"{name}: target replica {unknown[0]} is not a live broker (live: "
            f"{', '.join(map(str, sorted(live))) or 'none'})"
        )


def start(
    current: Sequence[int],
    ongoing: Reassignment | None,
    target: Sequence[int],
    throttle_bytes_per_s: int,
    now_ms: int,
) -> Reassignment | None:
    """The reassignment after a request for `target` (empty: cancel), given
    the partition's replicas now and the reassignment in progress, if any.
    None: no reassignment (cancelled, or the target is what it already has).
    A new target for a partition already moving keeps its original replicas
    (what a cancel restores)."""
    original = tuple(ongoing.original) if ongoing is not None else tuple(current)
    if not target or tuple(target) == original:
        return None
    return Reassignment(
        target=tuple(target),
        original=original,
        throttle_bytes_per_s=throttle_bytes_per_s,
        started_ms=ongoing.started_ms if ongoing is not None else now_ms,
    )


def state_for_replicas(
    replicas: Sequence[int],
    state: PartitionState,
    live: Collection[int],
    torn: Collection[int] = frozenset(),
    figures: Mapping[int, LogFigures] | None = None,
    min_isr: int = 1,
) -> PartitionState | None:
    """The partition's state once its replicas are `replicas`: the ISR and
    the eligible leader replicas cut to them (election_rule.next_elr, with
    the topic's min.insync.replicas `min_isr`); a leader not among them
    replaced, in a new epoch (fencing the old leader), by the first of them
    that is alive (`live`: can serve it),
    in the ISR and not `torn` (its broker lists its log torn:
    LiveBrokers.torn_of), or with every ISR member back and torn by the one
    holding the most (`figures`: LiveBrokers.torn_figures_of), or else by
    an eligible leader replica as the controller's would. The same state
    when nothing changes; None when nobody may lead yet."""
    isr = tuple(b for b in state.isr if b in replicas)
    elr = next_elr(state.isr, isr, state.elr, min_isr, replicas)
    if state.leader >= 0 and state.leader in replicas:
        if isr == state.isr and elr == state.elr:
            return state
        return PartitionState(state.leader, state.leader_epoch, isr, state.version + 1, elr)
    # The controller's rule (election_rule.elect_in_sync), clean only: a
    # reassignment never loses what only the ISR had. Whether every ISR
    # member is back and torn is asked of the whole ISR, the leaving leader
    # too: while it serves, the torn ones catch up from it and the move
    # waits for that, rather than making the others truncate to a cut log.
    # The ELR is asked whole too (a leaving member of it may return with
    # every acknowledged record); only one that stays may lead.
    elected = elect_in_sync(replicas, state.isr, live, torn, figures, eligible=isr, elr=state.elr)
    if elected is None:
        return None
    if elected.leader not in isr:
        # From the ELR: it joins the ISR and leaves the ELR.
        isr = (elected.leader, *isr)
        elr = next_elr(state.isr, isr, state.elr, min_isr, replicas)
    return PartitionState(elected.leader, state.leader_epoch + 1, isr, state.version + 1, elr)


def is_complete(reassignment: Reassignment, state: PartitionState) -> bool:
    """Every target replica is in the ISR of a led partition: the leaving
    replicas may go."""
    return state.leader >= 0 and all(b in state.isr for b in reassignment.target)
