"""Replication state of one partition on this broker: its role, and as
leader, each follower's progress, the ISR and the high watermark.

The leader learns a follower's log end offset (LEO) from the fetch offset of
its ReplicaFetch requests. The high watermark (HW) is the smallest LEO over
the ISR, the leader included; it never moves backwards. A follower is
"caught up" at a fetch whose offset reaches the leader's LEO as it was when
the previous answer to that follower was sent (Kafka's rule: under constant
load a follower that keeps up still counts as caught up). The ISR itself is
what etcd says: this class only proposes changes (`isr_to_shrink`,
`isr_to_expand`); the ClusterLink writes them, fenced by the partition
state's revision and leader epoch, and the watch brings them back.

While a proposal is outstanding, the HW is the smallest LEO over the
"maximal ISR": the ISR and the replicas the proposal adds (Kafka's rule). A
proposal that was written is in etcd before the watch brings it back: had
the HW moved over the applied ISR alone meanwhile, the ISR in etcd would
name a replica that lacks acknowledged records, and the controller may
elect it. (One fault run lost 250 acknowledged records so, in a
reassignment: the HW rose on one follower's fetches while the joining
replica, proposed at the old HW, was not yet applied; it then led.)

That is enough only because, within a leader epoch, nobody but the leader
adds a replica to the ISR in etcd (Kafka's rule: the leader expands, the
controller shrinks or starts a new epoch). Every writer of the partition
state compares the mod revision of the state it read, so it changes what
etcd holds, and:
- the controller's elections (tidelog_coordinator.leader_election.decide)
  drop dead or restarted members in the same epoch; a new leader (failed,
  preferred, unclean) or no leader means a new epoch;
- reassignment start, cancel and completion (reassignment.state_for_replicas)
  cut the ISR to the new replicas, in a new epoch if the leader leaves;
- topic creation and CreatePartitions write the first state of a
  partition, which has no leader yet;
- a leader writes only in its epoch, against the state its proposal was
  computed from (ClusterLink.write_isr): a proposal from an ISR applied
  before a shrink would put the removed replica back (a broker that
  restarted with a torn log, removed by the controller). Nor does it write
  while a member it keeps registered again after that state: the
  controller tells a restarted member by its registration being newer than
  the state, and removes it; a newer state would hide that. Nor does it add
  a replica whose broker lists its log of the partition offline, which the
  controller keeps out: judged on the leader's view of the registration,
  and the write compares the registration's mod revision with the view's,
  since listing it is a rewrite in place that the watch may not have
  brought yet.
A shrink by the controller is safe for the HW: until the watch brings it,
the leader counts over the larger ISR it applied. A new epoch starts a new
PartitionReplication from the ISR etcd has. tests/unit/coordinator/
test_isr_only_shrinks_within_an_epoch.py guards the controller's rules.

A follower joins the ISR only by the rule of `may_join_isr`: it is
registered live in etcd (its broker key exists, with the registration its
last fetch was made under) and it fetched up to the HW (and this epoch's
start) within replica.lag.time.max.ms. A last-known LEO alone is not enough:
a frozen follower's LEO stays where it was, and while the HW stands still
it would look caught up forever.

Not thread-safe: the broker's event loop owns it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum


class Role(Enum):
    LEADER = "leader"
    FOLLOWER = "follower"
    #: Hosting the log, but no live leader to follow (leader -1).
    NONE = "none"


@dataclass
class FollowerProgress:
    #: The follower's log end offset, as its last fetch said (-1: unknown).
    log_end_offset: int = -1
    #: Monotonic ms of the last fetch that found it caught up.
    last_caught_up_ms: int = 0
    #: The leader's LEO when the last answer to this follower was sent.
    leader_leo_at_last_answer: int = 0
    #: Monotonic ms of the follower's last fetch (its LEO is from then).
    last_fetch_ms: int = 0
    #: The etcd revision of the follower's broker registration when it made
    #: that fetch (0: none): progress made under an earlier registration (a
    #: previous incarnation of the broker) does not count for the ISR.
    registration: int = 0


#: The registration revision of a live broker, or None when it is not
#: registered (its lease expired): what the ClusterLink's watch knows.
RegistrationOf = Callable[[int], int | None]


def may_join_isr(
    progress: FollowerProgress,
    *,
    now_ms: int,
    lag_ms: int,
    high_watermark: int,
    epoch_start_offset: int,
    live_registration: int | None,
) -> bool:
    """Whether a follower outside the ISR may join it (pure; tested alone).

    Live: its broker is registered now, under the registration its last
    fetch was made with. Caught up recently: that fetch, at most `lag_ms`
    ago, reached the HW and this epoch's start offset."""
    return (
        live_registration is not None
        and progress.registration == live_registration
        and now_ms - progress.last_fetch_ms <= lag_ms
        and progress.log_end_offset >= max(high_watermark, epoch_start_offset)
    )


@dataclass
class PartitionReplication:
    """Role, epoch, ISR and (as leader) the followers of one partition."""

    topic: str
    partition: int
    role: Role
    leader_id: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    #: Monotonic ms when this broker took its current role.
    since_ms: int
    high_watermark: int = 0
    followers: dict[int, FollowerProgress] = field(default_factory=dict)
    #: The mod revision of the partition state applied last (0: not known).
    state_revision: int = 0
    #: The ISR change being written to etcd, or written and not yet brought
    #: back by the watch (one at a time); None: none.
    proposed_isr: list[int] | None = None
    #: `state_revision` when the change was proposed: a state applied with a
    #: later revision (the change, or what superseded it) ends the proposal.
    proposal_base_revision: int = 0
    #: As leader: the log end offset when this epoch began. A follower joins
    #: the ISR only once it has everything up to here too, because the HW a
    #: new leader starts from may lag what the previous leader committed.
    epoch_start_offset: int = 0

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    @property
    def isr_change_pending(self) -> bool:
        return self.proposed_isr is not None

    def propose_isr(self, isr: list[int]) -> list[int]:
        """An ISR change is about to be written: the HW waits for the
        replicas it adds from now on (see the module doc). Returns the
        proposal: a new list, `proposed_isr` itself, which names this
        proposal (by identity) to its writer and to `end_isr_proposal`."""
        self.proposed_isr = list(isr)
        self.proposal_base_revision = self.state_revision
        return self.proposed_isr

    def end_isr_proposal(self, proposal: list[int] | None = None) -> bool:
        """The change was refused, failed, or its outcome applied: True when
        a proposal ended. `proposal`: end only that one, if it is still
        outstanding (None: whichever is). A writer that learns late that its
        proposal was not written must not end the next one, which a newer
        state may have let begin meanwhile: that one may be in etcd already."""
        if self.proposed_isr is None or (
            proposal is not None and self.proposed_isr is not proposal
        ):
            return False
        self.proposed_isr = None
        return True

    def maximal_isr(self) -> list[int]:
        """The ISR, plus the replicas an outstanding proposal adds."""
        if self.proposed_isr is None:
            return self.isr
        return self.isr + [r for r in self.proposed_isr if r not in self.isr]

    def start_leading(self, me: int, leader_leo: int) -> None:
        """Fresh follower progress: every follower counts as caught up now, so
        it has replica.lag.time.max.ms to show up before it leaves the ISR."""
        self.followers = {
            r: FollowerProgress(last_caught_up_ms=self.since_ms) for r in self.replicas if r != me
        }
        self.epoch_start_offset = leader_leo
        self.advance_high_watermark(me, leader_leo)

    def on_follower_fetch(
        self, follower: int, fetch_offset: int, leader_leo: int, now_ms: int, registration: int
    ) -> None:
        """Record a fetch of `follower`, one of the replicas, made under its
        broker registration `registration` (its LEO is `fetch_offset`)."""
        progress = self.followers.setdefault(follower, FollowerProgress(last_caught_up_ms=now_ms))
        progress.log_end_offset = fetch_offset
        progress.last_fetch_ms = now_ms
        progress.registration = registration
        if fetch_offset >= leader_leo or fetch_offset >= progress.leader_leo_at_last_answer:
            progress.last_caught_up_ms = now_ms

    def on_answer(self, follower: int, leader_leo: int) -> None:
        progress = self.followers.get(follower)
        if progress is not None:
            progress.leader_leo_at_last_answer = leader_leo

    def advance_high_watermark(self, me: int, leader_leo: int) -> bool:
        """Recompute HW = min LEO over the maximal ISR; True when it moved forward."""
        low = leader_leo
        for member in self.maximal_isr():
            if member == me:
                continue
            progress = self.followers.get(member)
            low = min(low, -1 if progress is None else progress.log_end_offset)
        if low > self.high_watermark:
            self.high_watermark = low
            return True
        return False

    def isr_to_shrink(self, me: int, now_ms: int, lag_ms: int) -> list[int] | None:
        """The ISR without followers that were not caught up for `lag_ms`, or None."""
        lagging = [
            r
            for r in self.isr
            if r != me
            and (p := self.followers.get(r)) is not None
            and now_ms - p.last_caught_up_ms > lag_ms
        ]
        if not lagging:
            return None
        return [r for r in self.isr if r not in lagging]

    def isr_to_expand(
        self, now_ms: int, lag_ms: int, registration_of: RegistrationOf
    ) -> list[int] | None:
        """The ISR plus the followers that `may_join_isr`, or None."""
        joining = [
            r
            for r, p in self.followers.items()
            if r not in self.isr
            and r in self.replicas
            and may_join_isr(
                p,
                now_ms=now_ms,
                lag_ms=lag_ms,
                high_watermark=self.high_watermark,
                epoch_start_offset=self.epoch_start_offset,
                live_registration=registration_of(r),
            )
        ]
        if not joining:
            return None
        return [r for r in self.replicas if r in self.isr or r in joining]
