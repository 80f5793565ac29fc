"""The etcd key layout of a Tidelog cluster: the one module that spells keys.

Everything lives under a configurable prefix (default `/tidelog`), so several
clusters (or tests) can share one etcd. Values are UTF-8 JSON.

    <prefix>/cluster_id                              cluster id, created once
    <prefix>/brokers/ids/<broker_id>                 lease-bound {id, host, port, rack, ...,
                                                     offline_partitions}
    <prefix>/coordinators/<id>                       lease-bound {id, host, port}
    <prefix>/controller/<lease_id:x>                 election candidates, lease-bound
                                                     {id, host, port}; the lowest
                                                     create revision is the controller
    <prefix>/topics/<topic>                          {name, topic_id, partitions:
                                                     [{partition, replicas}], configs
                                                     (overrides), version, created_ms,
                                                     reassignments (when any): {p:
                                                     {target, original,
                                                     throttle_bytes_per_s, started_ms}}}
    <prefix>/partitions/<topic>/<p>/state            {leader, leader_epoch, isr, version}
    <prefix>/groups/<group>/members/<member_key>     lease-bound {member_id, instance_id,
                                                     client_id, topics, pattern, assignor,
                                                     session_timeout_ms,
                                                     rebalance_timeout_ms, member_epoch,
                                                     owned}
    <prefix>/groups/<group>/state                    {group_epoch, assignor, target:
                                                     {member_key: [[topic, p], ...]}}
    <prefix>/offsets/<group>/<topic>/<p>             {offset, metadata, commit_time_ms}
    <prefix>/producer_ids/next                       the next producer id to allocate
                                                     (decimal), raised by transaction
    <prefix>/producer_ids/keys/<producer_key>        {producer_id, epoch} of the producer
                                                     that last initialised with that key
    <prefix>/security/acls/<binding id>              one ACL binding (tidelog_server.acls);
                                                     the id is a digest of its fields
    <prefix>/security/users/<user>                   {mechanism, salt, hash, ...}: a salted
                                                     scrypt hash, never the password
    <prefix>/security/quotas/<principal>/<client id> {producer_byte_rate, ...}

Two deliberate departures from the first sketch of this layout:
- offsets live under `offsets/`, not `groups/<g>/offsets/`: every coordinator
  replica watches `groups/` to push assignments, and offsets under it would
  send every commit to every replica's watch for nothing;
- a member's epoch and owned partitions live in its own (lease-bound) member
  key, not in the group state: they change when that member acknowledges,
  written by the one replica serving it, and vanish with its session.

Group ids, instance ids and producer keys may hold any character, so they are
percent-encoded in keys; topic names are already safe ([a-zA-Z0-9._-]).
A member's key is `i-<instance id>` for a static member (so a restarted
instance finds its old key) and `m-<member id>` otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import quote, unquote

from tidelog.types import TopicPartition


def _q(part: str) -> str:
    return quote(part, safe="")


class Keys:
    """Key builders for one cluster prefix. Immutable; thread-safe."""

    def __init__(self, prefix: str = "/tidelog") -> None:
        self.prefix = "/" + prefix.strip("/")

    def _k(self, *parts: str) -> bytes:
        return "/".join((self.prefix, *parts)).encode()

    # Cluster
    @property
    def cluster_id(self) -> bytes:
        return self._k("cluster_id")

    @property
    def brokers(self) -> bytes:
        return self._k("brokers", "ids", "")

    def broker(self, broker_id: int) -> bytes:
        return self._k("brokers", "ids", str(broker_id))

    @property
    def coordinators(self) -> bytes:
        return self._k("coordinators", "")

    def coordinator(self, coordinator_id: str) -> bytes:
        return self._k("coordinators", _q(coordinator_id))

    @property
    def election(self) -> bytes:
        return self._k("controller", "")

    # Topics
    @property
    def topics(self) -> bytes:
        return self._k("topics", "")

    def topic(self, name: str) -> bytes:
        return self._k("topics", name)

    @property
    def all_partition_states(self) -> bytes:
        return self._k("partitions", "")

    def partition_states(self, topic: str) -> bytes:
        return self._k("partitions", topic, "")

    def partition_state(self, topic: str, partition: int) -> bytes:
        return self._k("partitions", topic, str(partition), "state")

    # Groups
    @property
    def groups(self) -> bytes:
        return self._k("groups", "")

    def group(self, group_id: str) -> bytes:
        return self._k("groups", _q(group_id), "")

    def members(self, group_id: str) -> bytes:
        return self._k("groups", _q(group_id), "members", "")

    def member(self, group_id: str, member_key: str) -> bytes:
        return self._k("groups", _q(group_id), "members", _q(member_key))

    def group_state(self, group_id: str) -> bytes:
        return self._k("groups", _q(group_id), "state")

    @property
    def all_offsets(self) -> bytes:
        return self._k("offsets", "")

    def offsets(self, group_id: str) -> bytes:
        return self._k("offsets", _q(group_id), "")

    def offset(self, group_id: str, tp: TopicPartition) -> bytes:
        return self._k("offsets", _q(group_id), tp.topic, str(tp.partition))

    def offset_keys(self, group_id: str, tps: Iterable[TopicPartition]) -> list[bytes]:
        """`offset(group_id, tp)` of each of `tps` (a commit's keys: the
        group's part quoted once, not once per partition)."""
        group = "/".join((self.prefix, "offsets", _q(group_id), ""))
        return [f"{group}{tp.topic}/{tp.partition}".encode() for tp in tps]

    # Idempotent producers
    @property
    def producer_id_counter(self) -> bytes:
        return self._k("producer_ids", "next")

    def producer_key(self, producer_key: str) -> bytes:
        return self._k("producer_ids", "keys", _q(producer_key))

    # Security (ACLs, credentials, quotas)
    @property
    def security(self) -> bytes:
        return self._k("security", "")

    @property
    def acls(self) -> bytes:
        return self._k("security", "acls", "")

    def acl(self, binding_id: str) -> bytes:
        return self._k("security", "acls", binding_id)

    @property
    def users(self) -> bytes:
        return self._k("security", "users", "")

    def user(self, name: str) -> bytes:
        return self._k("security", "users", _q(name))

    @property
    def quotas(self) -> bytes:
        return self._k("security", "quotas", "")

    def quota(self, principal: str, client_id: str) -> bytes:
        return self._k("security", "quotas", _q(principal), _q(client_id))

    # Parsing (for watch events and listings)
    def parse_group_key(self, key: bytes) -> tuple[str, str, str] | None:
        """(group id, "members" | "state", member key or "") for a key under groups/."""
        rest = key.decode()[len(self.prefix) + len("/groups/") :]
        parts = rest.split("/")
        if len(parts) == 2 and parts[1] == "state":
            return unquote(parts[0]), "state", ""
        if len(parts) == 3 and parts[1] == "members":
            return unquote(parts[0]), "members", unquote(parts[2])
        return None

    def parse_offset_key(self, key: bytes) -> tuple[str, TopicPartition] | None:
        """(group id, partition) for a key under offsets/."""
        rest = key.decode()[len(self.prefix) + len("/offsets/") :]
        parts = rest.split("/")
        if len(parts) != 3 or not parts[2].isdigit():
            return None
        return unquote(parts[0]), TopicPartition(parts[1], int(parts[2]))

    def parse_partition_state_key(self, key: bytes) -> TopicPartition | None:
        """The partition of a key under partitions/, or None for any other key."""
        rest = key.decode()[len(self.prefix) + len("/partitions/") :]
        parts = rest.split("/")
        if len(parts) != 3 or parts[2] != "state" or not parts[1].isdigit():
            return None
        return TopicPartition(parts[0], int(parts[1]))

    def tail(self, key: bytes, prefix: bytes) -> str:
        """The part of `key` after `prefix`, decoded."""
        return unquote(key[len(prefix) :].decode())


def static_member_key(instance_id: str) -> str:
    return "i-" + instance_id


def dynamic_member_key(member_id: str) -> str:
    return "m-" + member_id


def prefix_end(prefix: bytes) -> bytes:
    """The end of the key range holding every key that starts with `prefix`."""
    data = bytearray(prefix)
    for i in range(len(data) - 1, -1, -1):
        if data[i] < 0xFF:
            data[i] += 1
            return bytes(data[: i + 1])
    return b"\0"
