"""Limits on everything a client sends to the Group service, in one place.

Each string and list of a group RPC is bounded here, before anything is
stored in etcd or echoed in an error: a member record must stay far below
etcd's request limit (1.5 MiB), and an error message never repeats the
offending value (only its field, its size and the limit). A violation is
INVALID_REQUEST naming the limit.

Subscription patterns are RE2 expressions (`google-re2`): matching is linear
in the topic name's length whatever the pattern, so no pattern can hold the
event loop (Python's `re` backtracks: `(a+)+b` against a long topic name ran
forever and stopped the coordinator). RE2 also bounds the memory of a
compiled pattern (`max_mem`).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sized

import re2
from tidelog.errors import InvalidRequestError
from tidelog.v1 import common_pb2, group_pb2

from tidelog_coordinator.topic_names import validate_topic_name_cached

GROUP_ID_MAX_CHARS = 249
#: Member ids are uuid4 hex (32 characters); 64 leaves room and no more.
MEMBER_ID_MAX_CHARS = 64
#: Tokens are secrets.token_urlsafe(32) (43 characters).
MEMBER_TOKEN_MAX_CHARS = 64
GROUP_INSTANCE_ID_MAX_CHARS = 249
CLIENT_ID_MAX_CHARS = 255
ASSIGNOR_MAX_CHARS = 64
#: Topics named in one subscription (each at most 249 characters), and
#: their characters in total: the subscription is stored in the member key.
SUBSCRIBED_TOPICS_MAX = 1_000
SUBSCRIBED_TOPICS_MAX_CHARS = 64 * 1024
#: Members of one group (the default of --group-max-members). Each costs a
#: lease, a key and a share of every reconcile of the group (the assignors
#: run over all members); checked against the replica's cache, so racing
#: joins on several replicas may overshoot it by a few.
GROUP_MAX_MEMBERS = 1_000
SUBSCRIBED_TOPIC_REGEX_MAX_CHARS = 1_000
#: Memory RE2 may use for one compiled pattern (its default is 8 MiB).
REGEX_MAX_MEM_BYTES = 1 << 20
#: Partitions in any one list: an acknowledgement, a commit, a fetch.
PARTITIONS_MAX = 10_000
#: Free text stored with a committed offset.
OFFSET_METADATA_MAX_BYTES = 4096
#: Largest committable offset: 2^53, the largest integer every JSON reader
#: of the offset keys represents exactly, and far beyond any real log.
OFFSET_MAX = 1 << 53


def validate_group_id(group_id: str) -> str:
    if not group_id or len(group_id) > GROUP_ID_MAX_CHARS:
        raise InvalidRequestError(f"group id must be 1 to {GROUP_ID_MAX_CHARS} characters")
    return group_id


def check_chars(field: str, value: str, limit: int) -> str:
    if len(value) > limit:
        raise InvalidRequestError(f"{field} has {len(value)} characters: at most {limit}")
    return value


def check_count(field: str, items: Sized, limit: int) -> None:
    if len(items) > limit:
        raise InvalidRequestError(f"{field} has {len(items)} entries: at most {limit}")


def check_partitions(field: str, tps: Collection[common_pb2.TopicPartition]) -> None:
    """A list of TopicPartition: its length and each topic name."""
    check_count(field, tps, PARTITIONS_MAX)
    for tp in tps:
        _check_topic(field, tp.topic)


def _check_topic(field: str, topic: str) -> None:
    # validate_topic_name's message would repeat a long name: bound it first.
    check_chars(f"a topic name in {field}", topic, 249)
    validate_topic_name_cached(topic)


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> re2._Regexp:
    """The compiled RE2 pattern (cached: every reconcile matches every
    member's pattern against every topic)."""
    check_chars("subscribed_topic_regex", pattern, SUBSCRIBED_TOPIC_REGEX_MAX_CHARS)
    options = re2.Options()
    options.max_mem = REGEX_MAX_MEM_BYTES
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args else "invalid"
        raise InvalidRequestError(
            f"subscribed_topic_regex is not a valid RE2 expression: {reason[:200]}"
        ) from None


def check_heartbeat(req: group_pb2.GroupHeartbeatRequest) -> None:
    """Every client-controlled field of a heartbeat (join or later)."""
    check_chars("group_id", req.group_id, GROUP_ID_MAX_CHARS)
    check_chars("member_id", req.member_id, MEMBER_ID_MAX_CHARS)
    check_chars("member_token", req.member_token, MEMBER_TOKEN_MAX_CHARS)
    check_chars("group_instance_id", req.group_instance_id, GROUP_INSTANCE_ID_MAX_CHARS)
    check_chars("client_id", req.client_id, CLIENT_ID_MAX_CHARS)
    check_chars("assignor", req.assignor, ASSIGNOR_MAX_CHARS)
    check_count("subscribed_topics", req.subscribed_topics, SUBSCRIBED_TOPICS_MAX)
    total = 0
    for topic in req.subscribed_topics:
        _check_topic("subscribed_topics", topic)
        total += len(topic)
    if total > SUBSCRIBED_TOPICS_MAX_CHARS:
        raise InvalidRequestError(
            f"subscribed_topics has {total} characters in all: "
            f"at most {SUBSCRIBED_TOPICS_MAX_CHARS}"
        )
    if req.subscribed_topic_regex:
        compile_pattern(req.subscribed_topic_regex)
    if req.HasField("ack"):
        check_partitions("ack.owned", req.ack.owned)


def check_member(group_id: str, member_id: str, member_token: str) -> None:
    check_chars("group_id", group_id, GROUP_ID_MAX_CHARS)
    check_chars("member_id", member_id, MEMBER_ID_MAX_CHARS)
    check_chars("member_token", member_token, MEMBER_TOKEN_MAX_CHARS)


def check_offsets(offsets: Collection[group_pb2.OffsetCommit]) -> None:
    """The OffsetCommit list of a commit or an admin change."""
    check_count("offsets", offsets, PARTITIONS_MAX)
    for o in offsets:
        _check_topic("offsets", o.topic)
        if not 0 <= o.offset <= OFFSET_MAX:
            raise InvalidRequestError(
                f"offset {o.offset} for {o.topic}-{o.partition} is out of range: 0 to {OFFSET_MAX}"
            )
        if len(o.metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
            raise InvalidRequestError(
                f"metadata of {o.topic}-{o.partition} is longer than "
                f"{OFFSET_METADATA_MAX_BYTES} bytes"
            )


def check_fetch(req: group_pb2.FetchOffsetsRequest) -> None:
    check_chars("group_id", req.group_id, GROUP_ID_MAX_CHARS)
    check_partitions("partitions", req.partitions)
