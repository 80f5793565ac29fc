"""A `Records.Consume` stream that is one member of a consumer group.

The stream's first request sets `group`; the gateway runs one
`AsyncConsumer` subscribed in that group for the stream's lifetime (no
auto-commit: only the client's commits move the group's offsets), so the
membership, its heartbeats and the partitions' positions live here while
the offsets live with the coordinators: a client that reconnects to another
gateway replica is a new member that starts from what it committed.

On the stream, besides records (paced by the client's record credit):

- `assignment` responses, written by the consumer's rebalance listener,
  which runs inside getmany(): so an assignment goes out before any record
  of a newly assigned partition, and a revocation after the last record of
  a revoked one. Before a revocation is acknowledged the commits the client
  has already sent are applied (at most COMMIT_DRAIN_S), so that a client
  that commits after processing loses no work to a rebalance it could not
  see coming.
- `commit` responses: commit requests are applied in order, one at a time,
  by a task of their own, and each is answered (CommitResult, with the
  typed error when nothing was committed). Only partitions the stream owns
  may be committed: a late commit of a partition that has moved would set
  its new owner's position back.

The member leaves when the stream ends; what it had not committed is read
again by the partitions' next owners (at-least-once).

Memory: the consumer's fetch window follows the client's record credit
(`records_common.CreditWindow`), recounted as the owned partitions change.

Limits: COMMITS_IN_FLIGHT unanswered commits per stream (the stream stops
reading requests until one is answered, so a client that sends commits and
reads nothing holds no more); COMMIT_PARTITIONS_MAX offsets per commit;
SUBSCRIBED_TOPICS_MAX topics; the session timeout within
SESSION_TIMEOUT_MS_MIN..SESSION_TIMEOUT_MS_MAX; credit and response size as
every consume stream (`records_common`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Set
from typing import Any

from tidelog import AsyncConsumer, TopicPartition
from tidelog.errors import (
    IllegalGenerationError,
    InvalidRequestError,
    RequestTimedOutError,
)
from tidelog.group import OffsetAndMetadata
from tidelog.names import validate_topic_name
from tidelog.v1 import common_pb2, log_pb2, records_pb2

from tidelog_gateway.cluster_view import ClusterView
from tidelog_gateway.errors import error_proto
from tidelog_gateway.records_common import (
    MAX_RECORDS_PER_RESPONSE,
    POLL_MS,
    CreditWindow,
    add_records,
    apply_requests,
    check_credit,
)

log = logging.getLogger("tidelog.gateway.records")

GROUP_ID_MAX_CHARS = 249
SUBSCRIBED_TOPICS_MAX = 1_000
SESSION_TIMEOUT_MS_MIN = 2_000
SESSION_TIMEOUT_MS_MAX = 300_000
COMMITS_IN_FLIGHT = 16
COMMIT_PARTITIONS_MAX = 10_000
#: How long a revocation waits for the commits the client already sent.
COMMIT_DRAIN_S = 10.0

_RESET = {
    log_pb2.OFFSET_SPEC_UNSPECIFIED: "earliest",
    log_pb2.EARLIEST: "earliest",
    log_pb2.LATEST: "latest",
}


def _tp_protos(partitions: Iterable[TopicPartition]) -> list[common_pb2.TopicPartition]:
    return [common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(partitions)]


def check_group(view: ClusterView, request: records_pb2.ConsumeRequest) -> None:
    """The first request of a group stream, against the limits; unknown
    topics get their typed error."""
    group = request.group
    if not 1 <= len(group.group_id) <= GROUP_ID_MAX_CHARS:
        raise InvalidRequestError(f"group.group_id must be 1 to {GROUP_ID_MAX_CHARS} characters")
    if not 1 <= len(group.topics) <= SUBSCRIBED_TOPICS_MAX:
        raise InvalidRequestError(
            f"group.topics must name 1 to {SUBSCRIBED_TOPICS_MAX} topics, got {len(group.topics)}"
        )
    for topic in group.topics:
        validate_topic_name(topic)
        view.topic(topic)
    if group.reset not in _RESET:
        raise InvalidRequestError(f"group.reset must be EARLIEST or LATEST, got {group.reset}")
    timeout_ms = group.session_timeout_ms
    if timeout_ms and not SESSION_TIMEOUT_MS_MIN <= timeout_ms <= SESSION_TIMEOUT_MS_MAX:
        raise InvalidRequestError(
            f"group.session_timeout_ms must be 0 (the default) or {SESSION_TIMEOUT_MS_MIN} "
            f"to {SESSION_TIMEOUT_MS_MAX}, got {timeout_ms}"
        )
    if request.positions or request.remove:
        raise InvalidRequestError(
            "a group stream reads the partitions the group assigns to it: "
            "positions and remove are for streams without a group"
        )


class GroupConsumeSession:
    """One group Consume stream (see module doc): its consumer, credit,
    owned partitions, and the responses it owes the client."""

    def __init__(
        self,
        view: ClusterView,
        bootstrap: list[str],
        first: records_pb2.ConsumeRequest,
        options: dict[str, Any],
    ) -> None:
        check_group(view, first)
        group = first.group
        self._topics = list(group.topics)
        options = dict(options)
        if group.session_timeout_ms:
            options["session_timeout_ms"] = group.session_timeout_ms
        self._consumer = AsyncConsumer(
            bootstrap_servers=bootstrap,
            group_id=group.group_id,
            auto_offset_reset=_RESET[group.reset],
            **options,
        )
        self._window = CreditWindow(self._consumer, view)
        self._text = first.text
        self._max_records = MAX_RECORDS_PER_RESPONSE
        self._credit = 0
        self._first = True
        self._owned: set[TopicPartition] = set()
        #: Assignment changes and commit results, in the order they happened.
        self._outbox: deque[records_pb2.ConsumeResponse] = deque()
        self._commits: asyncio.Queue[records_pb2.ConsumeCommit] = asyncio.Queue()
        self._commit_slots = asyncio.Semaphore(COMMITS_IN_FLIGHT)
        self._unanswered = 0
        self._changed = asyncio.Event()
        self._input_closed = False
        self._closing = False
        self._failure: BaseException | None = None

    async def close(self) -> None:
        """Leave the group (the consumer's stop); commits nothing."""
        self._closing = True
        with contextlib.suppress(Exception):
            await self._consumer.stop()

    async def run(
        self, requests: AsyncIterator[records_pb2.ConsumeRequest], draining: asyncio.Event
    ) -> AsyncGenerator[records_pb2.ConsumeResponse]:
        await self._consumer.start()
        await self._consumer.subscribe(self._topics, listener=self)
        reader = asyncio.ensure_future(self._read(requests))
        committer = asyncio.ensure_future(self._commit_loop())
        try:
            while not draining.is_set():
                if self._failure is not None:
                    raise self._failure
                while self._outbox:
                    yield self._sent(self._outbox.popleft())
                if self._credit <= 0:
                    if self._input_closed and not self._unanswered:
                        return
                    self._changed.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(POLL_MS / 1000):
                            await self._changed.wait()
                    # No records wanted: only the group's events are applied.
                    await self._consumer.getmany(timeout_ms=0, max_records=0)
                    continue
                batch = await self._consumer.getmany(
                    timeout_ms=POLL_MS, max_records=min(self._credit, self._max_records)
                )
                # Assignment changes applied by this getmany go out before its records.
                while self._outbox:
                    yield self._sent(self._outbox.popleft())
                response = records_pb2.ConsumeResponse()
                add_records(response, batch.values(), self._text)
                if response.records:
                    self._credit -= len(response.records)
                    self._window.sent(response)
                    self._window.update(self._credit)
                    yield response
        finally:
            reader.cancel()
            committer.cancel()

    def _sent(self, response: records_pb2.ConsumeResponse) -> records_pb2.ConsumeResponse:
        """`response` is being sent: a commit's answer frees its slot."""
        if response.HasField("commit"):
            self._unanswered -= 1
            self._commit_slots.release()
        return response

    # ------------------------------------------------------------ requests

    async def _read(self, requests: AsyncIterator[records_pb2.ConsumeRequest]) -> None:
        failure = await apply_requests(requests, self._apply)
        if failure is not None:
            self._failure = failure
        self._input_closed = True
        self._changed.set()

    async def _apply(self, request: records_pb2.ConsumeRequest) -> None:
        check_credit(request, self._credit)
        if not self._first and request.HasField("group"):
            raise InvalidRequestError("group is read from the first request of a stream only")
        if request.positions or request.remove:
            raise InvalidRequestError(
                "a group stream reads the partitions the group assigns to it: "
                "positions and remove are for streams without a group"
            )
        self._first = False
        if request.max_records:
            self._max_records = request.max_records
        if request.HasField("commit"):
            if len(request.commit.offsets) > COMMIT_PARTITIONS_MAX:
                raise InvalidRequestError(
                    f"a commit names {len(request.commit.offsets)} partitions, over the "
                    f"limit of {COMMIT_PARTITIONS_MAX}"
                )
            # At most COMMITS_IN_FLIGHT unanswered: wait for an answer to be sent.
            await self._commit_slots.acquire()
            self._unanswered += 1
            self._commits.put_nowait(request.commit)
        self._credit += request.credit_records
        self._window.update(self._credit)
        self._changed.set()

    # ------------------------------------------------------------ commits

    async def _commit_loop(self) -> None:
        while True:
            commit = await self._commits.get()
            result = records_pb2.CommitResult(correlation_id=commit.correlation_id)
            try:
                await self._consumer.commit(self._offsets(commit))
            except TimeoutError:
                # The consumer bounds a commit by its request timeout.
                timed_out = RequestTimedOutError("the commit did not finish in time: send it again")
                result.error.CopyFrom(error_proto(timed_out, "committing offsets"))
            except Exception as exc:  # answered, whatever it is: never a silent success
                result.error.CopyFrom(error_proto(exc, "committing offsets"))
            finally:
                self._outbox.append(records_pb2.ConsumeResponse(commit=result))
                self._commits.task_done()
                self._changed.set()

    def _offsets(
        self, commit: records_pb2.ConsumeCommit
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for entry in commit.offsets:
            tp = TopicPartition(entry.topic, entry.partition)
            if entry.offset < 0:
                raise InvalidRequestError(
                    f"offset must be >= 0 for {tp.topic}-{tp.partition}, got {entry.offset}"
                )
            offsets[tp] = OffsetAndMetadata(entry.offset, entry.metadata)
        foreign = sorted(set(offsets) - self._owned)
        if foreign:
            named = ", ".join(f"{t}-{p}" for t, p in foreign[:5])
            raise IllegalGenerationError(
                f"{len(foreign)} partition(s) of the commit are not assigned to this stream "
                f"({named}): nothing was committed; their records go to their owners again"
            )
        return offsets

    # ------------------------------------------------------------ rebalance listener

    async def on_partitions_revoked(self, revoked: Set[TopicPartition]) -> None:
        if self._closing:
            return
        # Commits the client sent before it could see the revocation.
        try:
            async with asyncio.timeout(COMMIT_DRAIN_S):
                await self._commits.join()
        except TimeoutError:
            log.warning("revoking %d partitions before the stream's commits finished", len(revoked))
        self._owned -= revoked
        self._tell(revoked=_tp_protos(revoked))

    def on_partitions_lost(self, lost: Set[TopicPartition]) -> None:
        if self._closing:
            return
        self._owned -= lost
        self._tell(lost=_tp_protos(lost))

    def on_partitions_assigned(self, assigned: Set[TopicPartition]) -> None:
        if self._closing:
            return
        self._owned |= assigned
        self._tell(assigned=_tp_protos(assigned))

    def _tell(self, **change: list[common_pb2.TopicPartition]) -> None:
        self._window.assigned(self._owned)
        self._outbox.append(
            records_pb2.ConsumeResponse(
                assignment=records_pb2.AssignmentChange(owned=_tp_protos(self._owned), **change)
            )
        )
        self._changed.set()
