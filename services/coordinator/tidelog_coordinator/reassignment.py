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
   target replica that is alive and in the ISR leads in a new epoch.

Cancel restores `original` the same way (`state_for_replicas(original)`).
No step removes a replica before the replicas that stay hold everything the
ISR acknowledged: the ISR only ever shrinks to members of it, which have
every record up to the high watermark.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from tidelog.errors import InvalidRequestError
from tidelog_server.election_rule import elect
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
    replicas: Sequence[int], state: PartitionState, live: Collection[int]
) -> PartitionState | None:
    """The partition's state once its replicas are `replicas`: the ISR cut
    to them; a leader not among them replaced by the first of them that is
    alive and in the ISR, in a new epoch (fencing the old leader). The same
    state when nothing changes; None when nobody could lead."""
    isr = tuple(b for b in state.isr if b in replicas)
    if state.leader >= 0 and state.leader in replicas:
        if isr == state.isr:
            return state
        return PartitionState(state.leader, state.leader_epoch, isr, state.version + 1)
    # The controller's rule (election_rule), clean only: a reassignment
    # never loses what only the ISR had.
    elected = elect(replicas, isr, live, unclean=False)
    if elected is None:
        return None
    return PartitionState(elected.leader, state.leader_epoch + 1, isr, state.version + 1)


def is_complete(reassignment: Reassignment, state: PartitionState) -> bool:
    """Every target replica is in the ISR of a led partition: the leaving
    replicas may go."""
    return state.leader >= 0 and all(b in state.isr for b in reassignment.target)
