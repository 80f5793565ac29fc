"""Which replica may lead a partition that has no leader able to serve: the
one rule that the controller elects by (tidelog_coordinator.leader_election.
decide) and that the describe path reads to say whether a leaderless
partition is offline for good (tidelog_server.leader_figures.
offline_partition_error), so that `tidelog topics describe` says what the
controller does. It lives here because the describe path (services/common)
may not import the coordinator.

As Kafka's: the first replica, in assignment order, that is in the ISR and
can serve leads (a clean election). With none, and where the topic's
effective `unclean.leader.election.enable` allows it, the first replica of
the assignment that can serve leads (an unclean election: what only the ISR
had is lost). Else nobody may lead: the partition waits until an ISR member
can serve again. An ISR member outside the assignment never leads, however
well it could serve.

Among ISR members that may have lost their tail at their restart (their broker's
registration lists them torn, `BrokerRegistration.torn_logs`), one leads
only when every ISR member is back and torn (nobody has more to wait for):
`elect_in_sync`, the clean election of every caller that moves leadership
(the controller's, tidelog_coordinator.leader_election; a reassignment's
completion or cancel, tidelog_coordinator.reassignment). Then each one's
`LogFigures` are compared, and the one holding the most leads rather than
the first in assignment order, as Kafka's controller (KIP-966) elects among
ISR members by their last epoch and log end: see `most_complete`.

Eligible leader replicas (ELR, Kafka's KIP-966; `PartitionState.elr`):
replicas removed from the ISR while it was below the topic's
min.insync.replicas (`next_elr`, the one rule of every write that changes
an ISR). No acks=all record is acknowledged while the ISR is below it, so
an ELR member holds every acknowledged record, as an ISR member does: it
counts as one for who may return with more and who may lead, after the
untorn ISR members (`elect_in_sync`). Without it, an ISR shrunk below
min.insync.replicas to a member that then came back torn let that member
lead while the member removed held every acknowledged record, and the
others truncated to its cut (2.8 M acknowledged records in a 900 s soak).

"Can serve" is each caller's to say from what it reads (a broker that is
registered and does not list its log of the partition offline; the
controller also sets aside brokers that restarted since the state was
written while another ISR member can lead). What follows from an election
(the epoch, the ISR written, the etcd transaction, the log line, the
describe path's error text) stays with the callers. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class LogFigures:
    """How much of a partition one replica's log holds, as its broker
    publishes it for a torn log (`BrokerRegistration.torn_logs`): compared
    as (last_epoch, log_end_offset), higher holds more (`most_complete`)."""

    #: The newest leader epoch of a record in the log (its epoch history's
    #: latest entry); -1 for a log without one (empty, or written before
    #: epoch histories).
    last_epoch: int
    #: The offset after its last record.
    log_end_offset: int


@dataclass(frozen=True, slots=True)
class Election:
    """Who leads a leaderless partition, and how it was chosen."""

    leader: int
    #: True: the leader is in the ISR (nothing acknowledged is lost);
    #: False: an unclean election (the new ISR is the leader alone).
    clean: bool


def elect(
    replicas: Sequence[int],
    isr: Collection[int],
    can_serve: Container[int],
    unclean: bool,
    figures: Mapping[int, LogFigures] | None = None,
) -> Election | None:
    """The leader of a partition with assignment `replicas` (in placement
    order), in-sync replicas `isr`, whose brokers in `can_serve` can serve
    it, when the topic allows an unclean election (`unclean`) or not; None
    when nobody may lead (module doc).

    `figures`: what each ISR member's log holds, given when the candidates
    are torn replicas (module doc): the clean election takes the most
    complete of them (`most_complete`). None, or a candidate missing from
    it (a broker older than those figures): the first in assignment order,
    as before."""
    candidates = [replica for replica in replicas if replica in isr and replica in can_serve]
    if candidates:
        return Election(most_complete(candidates, figures or {}), clean=True)
    if unclean:
        for replica in replicas:
            if replica in can_serve:
                return Election(replica, clean=False)
    return None


def elect_in_sync(
    replicas: Sequence[int],
    isr: Collection[int],
    can_serve: Collection[int],
    torn: Collection[int],
    figures: Mapping[int, LogFigures] | None = None,
    eligible: Collection[int] | None = None,
    elr: Collection[int] = (),
) -> Election | None:
    """The clean election of a partition with assignment `replicas`, ISR
    `isr` (all of it, members outside `replicas` too) and eligible leader
    replicas `elr` (module doc), whose brokers in `can_serve` can serve it
    and of which those in `torn` may have lost their tail (module doc);
    None when no ISR or ELR member may lead yet:

    - the first of `replicas` in the ISR that can serve and is not torn;
    - none: the first of `replicas` in the ELR that can serve and is not
      torn (it holds every acknowledged record: KIP-966);
    - none, and every ISR and ELR member can serve and is torn: the one of
      them in `replicas` holding the most (`figures`; `most_complete`).
      Nobody has more to wait for;
    - else nobody: an ISR or ELR member that is away may return with more,
      and an untorn one that cannot lead here (the leader of a reassignment
      that drops it) is where the torn ones catch up from, becoming
      electable.

    `eligible`: the ISR members that may lead (default: all of `isr`); the
    controller sets aside those restarted since the state was written
    (leader_election.decide). A leader from the ELR is not in the ISR: the
    caller adds it (and `next_elr` takes it out of the ELR). The unclean
    election is the caller's."""
    candidates = [b for b in (isr if eligible is None else eligible) if b in can_serve]
    untorn = set(can_serve) - set(torn)
    elected = elect(replicas, candidates, untorn, unclean=False)
    if elected is not None:
        return elected
    eligible_elr = [b for b in elr if b in can_serve and b not in isr]
    elected = elect(replicas, eligible_elr, untorn, unclean=False)
    if elected is not None or not (candidates or eligible_elr):
        return elected
    if all(b in can_serve and b in torn for b in (*isr, *elr)):
        return elect(replicas, candidates + eligible_elr, can_serve, unclean=False, figures=figures)
    return None


def next_elr(
    old_isr: Collection[int],
    new_isr: Collection[int],
    old_elr: Collection[int],
    min_isr: int,
    replicas: Sequence[int],
) -> tuple[int, ...]:
    """The eligible leader replicas (module doc) after an ISR change from
    `old_isr` to `new_isr` of a partition with ELR `old_elr`, whose topic's
    min.insync.replicas is `min_isr` and whose assignment is `replicas`:
    none once the new ISR reaches min.insync.replicas (records are
    acknowledged without them again); else the old ELR and the members
    removed now, less the new ISR, in assignment order (a replica leaving
    the assignment leaves it too). Every write of a state with a new ISR
    sets its ELR by this; one that drops the ELR elects as before it, which
    may lose acknowledged records."""
    if len(new_isr) >= min_isr:
        return ()
    kept = set(old_elr) | (set(old_isr) - set(new_isr))
    return tuple(b for b in replicas if b in kept and b not in new_isr)


def most_complete(candidates: Sequence[int], figures: Mapping[int, LogFigures]) -> int:
    """The one of `candidates` (ISR members, in assignment order) whose log
    holds the most: the highest (last epoch, log end offset) in `figures`,
    the first in order among equals; the first in order when `figures`
    lacks any of them (nothing to compare it by).

    Why this order: a record acknowledged with acks=all is on every ISR
    member, so each of them held it before its tail was cut; what a cut
    lost, only a replica whose cut went less deep still has. Records of a
    later epoch were written by a later leader, which held all that was
    acknowledged before its epoch began, and every replica's log agrees
    with its leader's below what it fetched; so among replicas, the one
    with the newest last epoch, and of those the longest log, holds all
    that any of them holds (the others' logs are a prefix of its log, as
    far as acknowledged records go), and the others truncate to it losing
    nothing acknowledged that any survivor kept. The first in order (what
    a broker without figures gets) may be the one cut deepest.
    """
    if any(replica not in figures for replica in candidates):
        return candidates[0]
    best = candidates[0]
    for replica in candidates[1:]:
        if figures[replica] > figures[best]:
            best = replica
    return best
