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

"Can serve" is each caller's to say from what it reads (a broker that is
registered and does not list its log of the partition offline; the
controller also sets aside brokers that restarted since the state was
written while another ISR member can lead). What follows from an election
(the epoch, the ISR written, the etcd transaction, the log line, the
describe path's error text) stays with the callers. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Sequence
from dataclasses import dataclass


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
) -> Election | None:
    """The leader of a partition with assignment `replicas` (in placement
    order), in-sync replicas `isr`, whose brokers in `can_serve` can serve
    it, when the topic allows an unclean election (`unclean`) or not; None
    when nobody may lead (module doc)."""
    for replica in replicas:
        if replica in isr and replica in can_serve:
            return Election(replica, clean=True)
    if unclean:
        for replica in replicas:
            if replica in can_serve:
                return Election(replica, clean=False)
    return None
