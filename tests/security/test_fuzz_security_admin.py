"""Hostile input against the security admin RPCs, from a caller allowed to use them.

The other fuzz test (test_fuzz_services.py) calls them as User:ANONYMOUS on a
cluster without TLS, and with the pools of hostile strings almost no ACL
binding, user or quota passes the checks, so the etcd writes behind them
were never reached. Here the cluster requires TLS and client certificates,
allows nothing that no ACL allows, and the fuzzer is User:admin, a super
user; its cases draw each checked field (resource type, pattern type,
operation, permission, principal, host, user, client id, quota name and
rate) from values the services accept most of the time, hostile ones
otherwise, so that whole requests up to their limits reach etcd.

Same verdict rules (tests/security/fuzz_sending.py) and seeds as the other
fuzz test: GATING_SEED in `make test`, `TIDELOG_FUZZ_SEED` /
`TIDELOG_FUZZ_CASE` to replay; `TIDELOG_FUZZ_SECURITY_CASES` sets how many
(default 3,000: ~20 s for the whole test on a 2-core machine, the cluster's
start included).

Afterwards every service is SERVING; an ACL granted before the run still
permits and denies as before everywhere (or, if a fuzzed DeleteAcls removed
it, its absence is in force everywhere); a principal no ACL names is still
refused; the super user still administers the cluster.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2
from tidelog.v1 import admin_pb2, admin_pb2_grpc, log_pb2, log_pb2_grpc, security_pb2
from tidelog_server.acls import MAX_BINDINGS_PER_REQUEST, OPERATIONS
from tidelog_server.quotas import QUOTA_KEYS

from tests.security.fuzz_sending import (
    Sender,
    assert_no_bugs,
    cases_to_send,
    health_status,
    print_summary,
    send_all,
)
from tests.security.fuzzing import Fuzzer, targets_of
from tests.support.etcd import EtcdProcess
from tests.support.secure_cluster import (
    SecuredServices,
    client_credentials,
    eventually,
    secured_services,
)

CASES = int(os.environ.get("TIDELOG_FUZZ_SECURITY_CASES", "3000"))
PREFIX = "/fuzz-security"
GUARDED_TOPIC = "fuzz-guarded"
SECURITY_RPCS = {
    "CreateAcls",
    "DescribeAcls",
    "DeleteAcls",
    "AlterUserCredentials",
    "DescribeUserCredentials",
    "AlterClientQuotas",
    "DescribeClientQuotas",
}
#: Values the services accept (and a few they refuse), by field name. The
#: principals are never User:alice, User:bob or User:*: what the fuzzer
#: grants or denies does not change what the checks after the run expect.
FIELD_VALUES: dict[str, tuple[object, ...]] = {
    "resource_type": ("topic", "group", "cluster", "Topic", "any"),
    "resource_name": ("fuzz-topic", "fuzz-", "*", "tidelog-cluster", "fuzz-group"),
    "pattern_type": ("literal", "prefixed", "match", "any", "PREFIXED"),
    "principal": ("User:fuzz", "User:fuzz-2", "User:<default>", "User:", "user:fuzz"),
    "host": ("*", "127.0.0.1", "::1", ""),
    "operation": (*OPERATIONS, "any", "read"),
    "permission": ("allow", "deny", "any", "DENY"),
    "user": ("fuzz", "fuzz-2", "u" * 256, "u" * 257, "with:colon"),
    "password": ("secret", "p" * 1024, "p" * 1025, ""),
    "deletions": ("fuzz", "fuzz-2", "nobody"),
    "users": ("fuzz", "fuzz-2", "nobody"),
    "client_id": ("", "fuzz-client", "c" * 255, "c" * 256),
    # A quota's name and rate (the map entry's key and value).
    "key": (*QUOTA_KEYS, "bytes"),
    "value": (1.0, 1000.0, 1e9, 0.0, -1.0, 5e-324, 1e-300, float("inf"), float("nan")),
}


class SecureCluster(SecuredServices):
    @property
    def addresses(self) -> list[str]:
        return [self.coordinator.address, self.broker.address, self.gateway.address]

    def processes(self) -> dict[str, psutil.Process]:
        return {
            f"coordinator {self.coordinator.address}": psutil.Process(self.coordinator.pid),
            f"broker {self.broker.address}": psutil.Process(self.broker.pid),
            f"gateway {self.gateway.address}": psutil.Process(self.gateway.pid),
        }

    def channel(self, who: str, address: str = "") -> grpc.Channel:
        credentials = client_credentials(self.certs, who)
        return grpc.secure_channel(address or self.coordinator.address, credentials)


@pytest.fixture(scope="module")
def secure_cluster(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SecureCluster]:
    root = tmp_path_factory.mktemp("fuzz-security")
    with secured_services(etcd.endpoint, root, prefix=PREFIX, users=("alice", "bob")) as services:
        yield SecureCluster(services.certs, services.coordinator, services.broker, services.gateway)


def _guard() -> security_pb2.AclBinding:
    return security_pb2.AclBinding(
        resource_type="topic",
        resource_name=GUARDED_TOPIC,
        pattern_type="literal",
        principal="User:alice",
        host="*",
        operation="Read",
        permission="allow",
    )


def _many() -> list[security_pb2.AclBinding]:
    return [
        security_pb2.AclBinding(
            resource_type="topic",
            resource_name=f"fuzz-many-{i}",
            principal="User:fuzz",
            operation="Write",
            permission="allow",
        )
        for i in range(MAX_BINDINGS_PER_REQUEST)
    ]


def _described(cluster: SecureCluster, who: str, address: str) -> bool:
    """Whether `who` may Describe the guarded topic, asked at `address`."""
    with cluster.channel(who, address) as channel:
        try:
            log_pb2_grpc.LogStub(channel).Metadata(
                log_pb2.MetadataRequest(topics=[GUARDED_TOPIC]), timeout=30
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                return False
            raise
    return True


def _expect_access(cluster: SecureCluster, alice: bool) -> None:
    """At every service: alice may (or may not) Describe the guarded topic, bob never."""
    for address in (cluster.broker.address, cluster.gateway.address):

        def probe(address: str = address) -> None:
            assert _described(cluster, "alice", address) is alice, ("alice", address)
            assert _described(cluster, "bob", address) is False, ("bob", address)

        eventually(probe)


def _remove_quotas(admin: admin_pb2_grpc.AdminStub) -> None:
    """Every quota the fuzzer set, removed (a rate <= 0 removes it)."""
    listed = admin.DescribeClientQuotas(security_pb2.DescribeClientQuotasRequest(), timeout=30)
    entries = [
        security_pb2.ClientQuota(entity=e.entity, values={k: 0.0 for k in e.values})
        for e in listed.entries
    ]
    step = MAX_BINDINGS_PER_REQUEST  # the entries one AlterClientQuotas takes
    for start in range(0, len(entries), step):
        reply = admin.AlterClientQuotas(
            security_pb2.AlterClientQuotasRequest(entries=entries[start : start + step]),
            timeout=60,
        )
        assert not [e for e in reply.results if e.code], reply


@pytest.mark.timeout(600)
def test_the_security_admin_rpcs_survive_hostile_input_from_a_super_user(
    secure_cluster: SecureCluster, fuzz_seed: int
) -> None:
    cluster = secure_cluster
    with cluster.channel("admin") as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        admin.CreateTopics(
            admin_pb2.CreateTopicsRequest(
                topics=[admin_pb2.NewTopic(name=GUARDED_TOPIC, partitions=1, replication_factor=1)]
            ),
            timeout=60,
        )
        granted = admin.CreateAcls(security_pb2.CreateAclsRequest(creations=[_guard()]), timeout=30)
        assert not granted.results[0].code, granted
        # A cluster with many ACLs: what a fuzzed DeleteAcls or DescribeAcls
        # matches its filters against.
        many = admin.CreateAcls(security_pb2.CreateAclsRequest(creations=_many()), timeout=60)
        assert not [e for e in many.results if e.code], many
    _expect_access(cluster, alice=True)

    targets = [t for t in targets_of([admin_pb2]) if t.path.rsplit("/", 1)[1] in SECURITY_RPCS]
    assert {t.path.rsplit("/", 1)[1] for t in targets} == SECURITY_RPCS
    fuzzer = Fuzzer(fuzz_seed, targets, names=["fuzz"], field_values=FIELD_VALUES)
    processes = cluster.processes()
    sender = Sender(cluster.addresses, client_credentials(cluster.certs, "admin"))
    served = sender.served_by(cluster.addresses)
    assert served.get("tidelog.v1.Admin"), f"no destination lists tidelog.v1.Admin: {served}"
    sender.route(served)
    started = time.monotonic()
    outcomes = send_all(sender, cases_to_send(fuzzer, CASES))
    print_summary(fuzz_seed, outcomes, time.monotonic() - started)
    assert_no_bugs(fuzz_seed, outcomes, processes)

    admin_credentials = client_credentials(cluster.certs, "admin")
    for name in processes:
        address = name.split(" ", 1)[1]
        assert health_status(address, admin_credentials) == health_pb2.HealthCheckResponse.SERVING
    with cluster.channel("admin") as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        # The quotas the fuzzer set for User:<default> would hold alice's
        # and bob's calls back: removed first, which also shows that the
        # super user still administers the cluster.
        _remove_quotas(admin)
        listed = admin.DescribeAcls(
            security_pb2.DescribeAclsRequest(
                filter=security_pb2.AclBindingFilter(principal="User:alice")
            ),
            timeout=30,
        )
        still_granted = _guard() in listed.acls
        _expect_access(cluster, alice=still_granted)
        # Granted (again): in force everywhere; removed: refused everywhere.
        admin.CreateAcls(security_pb2.CreateAclsRequest(creations=[_guard()]), timeout=30)
        _expect_access(cluster, alice=True)
        removed = admin.DeleteAcls(
            security_pb2.DeleteAclsRequest(
                filters=[security_pb2.AclBindingFilter(principal="User:alice")]
            ),
            timeout=30,
        )
        assert _guard() in removed.results[0].deleted
        _expect_access(cluster, alice=False)
