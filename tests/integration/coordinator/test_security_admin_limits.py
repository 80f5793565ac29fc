"""The security admin RPCs (ACLs, user credentials, quotas) on a real
coordinator and etcd, with requests as big as their limits allow: what one
request costs in etcd round trips does not grow with its entries, and an
entry given twice is refused in each of its entries, naming why.

The coordinator runs without TLS, so the caller is User:ANONYMOUS, allowed
as long as no ACL names the cluster (these tests name topics only).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tidelog.v1 import admin_pb2_grpc, common_pb2, security_pb2
from tidelog_server.acls import MAX_BINDINGS_PER_REQUEST

from tests.support.coordinator import CoordinatorProcess, start_coordinator
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(120)

#: etcd round trips one request of MAX_BINDINGS_PER_REQUEST entries may
#: cost, with the coordinator's own requests meanwhile (a few dozen): one
#: per entry would be MAX_BINDINGS_PER_REQUEST or more.
ETCD_REQUESTS_MAX = 200
ETCD_METHODS = ("Range", "Txn", "Put", "DeleteRange")


@pytest.fixture(scope="module")
def coordinator(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    root: Path = tmp_path_factory.mktemp("security-admin-limits")
    process = start_coordinator(
        etcd.endpoint, root / "logs", prefix="/security-admin-limits", coordinator_id="c0"
    )
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def admin(coordinator: CoordinatorProcess) -> Iterator[admin_pb2_grpc.AdminStub]:
    with grpc.insecure_channel(coordinator.address) as channel:
        yield admin_pb2_grpc.AdminStub(channel)


def _etcd_requests(etcd: EtcdProcess) -> int:
    return sum(etcd.requests_handled(method) for method in ETCD_METHODS)


def _binding(principal: str, topic: str) -> security_pb2.AclBinding:
    return security_pb2.AclBinding(
        resource_type="topic",
        resource_name=topic,
        principal=principal,
        operation="Read",
        permission="allow",
    )


def _bindings(principal: str) -> list[security_pb2.AclBinding]:
    return [_binding(principal, f"t-{i}") for i in range(MAX_BINDINGS_PER_REQUEST)]


def _quota(principal: str, client_id: str, rate: float) -> security_pb2.ClientQuota:
    return security_pb2.ClientQuota(
        entity=security_pb2.QuotaEntity(principal=principal, client_id=client_id),
        values={"request_rate": rate},
    )


def _listed(admin: admin_pb2_grpc.AdminStub, principal: str) -> list[str]:
    reply = admin.DescribeAcls(
        security_pb2.DescribeAclsRequest(filter=security_pb2.AclBindingFilter(principal=principal)),
        timeout=30,
    )
    return sorted(binding.resource_name for binding in reply.acls)


# Each entry of CreateAcls, DeleteAcls, AlterUserCredentials and
# AlterClientQuotas cost one or two etcd round trips (a DeleteAcls filter
# given n times: n per binding), up to the requests' limits.
def test_creating_and_deleting_a_thousand_acls_costs_a_few_etcd_requests(
    admin: admin_pb2_grpc.AdminStub, etcd: EtcdProcess
) -> None:
    before = _etcd_requests(etcd)
    reply = admin.CreateAcls(
        security_pb2.CreateAclsRequest(creations=_bindings("User:many")), timeout=60
    )
    assert _etcd_requests(etcd) - before < ETCD_REQUESTS_MAX
    assert [e.code for e in reply.results] == [common_pb2.NONE] * MAX_BINDINGS_PER_REQUEST
    assert len(_listed(admin, "User:many")) == MAX_BINDINGS_PER_REQUEST

    # Every binding matches all three filters; the first deletes them.
    everything = security_pb2.AclBindingFilter(principal="User:many")
    before = _etcd_requests(etcd)
    deleted = admin.DeleteAcls(security_pb2.DeleteAclsRequest(filters=[everything] * 3), timeout=60)
    assert _etcd_requests(etcd) - before < ETCD_REQUESTS_MAX
    assert [len(r.deleted) for r in deleted.results] == [MAX_BINDINGS_PER_REQUEST, 0, 0]
    assert not any(r.error.code for r in deleted.results)
    assert _listed(admin, "User:many") == []


def test_removing_a_thousand_users_costs_a_few_etcd_requests(
    admin: admin_pb2_grpc.AdminStub, etcd: EtcdProcess
) -> None:
    admin.AlterUserCredentials(
        security_pb2.AlterUserCredentialsRequest(
            upsertions=[security_pb2.UserCredentialUpsert(user="u-0", password="secret")]
        ),
        timeout=60,
    )
    names = [f"u-{i}" for i in range(MAX_BINDINGS_PER_REQUEST)]
    before = _etcd_requests(etcd)
    reply = admin.AlterUserCredentials(
        security_pb2.AlterUserCredentialsRequest(deletions=names), timeout=60
    )
    assert _etcd_requests(etcd) - before < ETCD_REQUESTS_MAX
    assert [r.user for r in reply.results] == names
    assert reply.results[0].error.code == common_pb2.NONE
    assert {r.error.code for r in reply.results[1:]} == {common_pb2.INVALID_REQUEST}
    assert reply.results[1].error.message == "no user 'u-1'"


def test_setting_a_thousand_quotas_costs_a_few_etcd_requests(
    admin: admin_pb2_grpc.AdminStub, etcd: EtcdProcess
) -> None:
    entries = [_quota("User:quota", f"c-{i}", 100.0) for i in range(MAX_BINDINGS_PER_REQUEST)]
    before = _etcd_requests(etcd)
    reply = admin.AlterClientQuotas(
        security_pb2.AlterClientQuotasRequest(entries=entries), timeout=60
    )
    assert _etcd_requests(etcd) - before < ETCD_REQUESTS_MAX
    assert [e.code for e in reply.results] == [common_pb2.NONE] * MAX_BINDINGS_PER_REQUEST
    described = admin.DescribeClientQuotas(
        security_pb2.DescribeClientQuotasRequest(principal="User:quota"), timeout=30
    )
    assert len(described.entries) == MAX_BINDINGS_PER_REQUEST
    assert {dict(e.values)["request_rate"] for e in described.entries} == {100.0}


def test_an_acl_given_twice_in_one_request_is_refused_in_each_entry(
    admin: admin_pb2_grpc.AdminStub,
) -> None:
    twice, once = _binding("User:twice", "a"), _binding("User:twice", "b")
    # The same binding, spelled differently: one key.
    twice_again = _binding("User:twice", "a")
    twice_again.operation, twice_again.pattern_type = "READ", "LITERAL"
    reply = admin.CreateAcls(
        security_pb2.CreateAclsRequest(creations=[twice, once, twice_again]), timeout=30
    )
    codes = [e.code for e in reply.results]
    assert codes == [common_pb2.INVALID_REQUEST, common_pb2.NONE, common_pb2.INVALID_REQUEST]
    assert "is given more than once in one CreateAcls request" in reply.results[0].message
    assert _listed(admin, "User:twice") == ["b"]


def test_a_user_given_twice_in_one_request_is_refused_in_each_entry(
    admin: admin_pb2_grpc.AdminStub,
) -> None:
    upsert = security_pb2.UserCredentialUpsert(user="twice", password="secret")
    other = security_pb2.UserCredentialUpsert(user="once", password="secret")
    reply = admin.AlterUserCredentials(
        security_pb2.AlterUserCredentialsRequest(upsertions=[upsert, other], deletions=["twice"]),
        timeout=30,
    )
    assert [(r.user, r.error.code) for r in reply.results] == [
        ("twice", common_pb2.INVALID_REQUEST),
        ("once", common_pb2.NONE),
        ("twice", common_pb2.INVALID_REQUEST),
    ]
    assert "user 'twice' is given more than once" in reply.results[0].error.message
    described = admin.DescribeUserCredentials(
        security_pb2.DescribeUserCredentialsRequest(users=["twice", "once"]), timeout=30
    )
    assert [(u.user, u.error.code) for u in described.users] == [
        ("twice", common_pb2.INVALID_REQUEST),
        ("once", common_pb2.NONE),
    ]


def test_a_quota_entity_given_twice_in_one_request_is_refused_in_each_entry(
    admin: admin_pb2_grpc.AdminStub,
) -> None:
    reply = admin.AlterClientQuotas(
        security_pb2.AlterClientQuotasRequest(
            entries=[
                _quota("User:q-twice", "", 10.0),
                _quota("User:q-once", "", 10.0),
                _quota("User:q-twice", "", 20.0),
            ]
        ),
        timeout=30,
    )
    codes = [e.code for e in reply.results]
    assert codes == [common_pb2.INVALID_REQUEST, common_pb2.NONE, common_pb2.INVALID_REQUEST]
    assert "is given more than once in one AlterClientQuotas request" in reply.results[0].message
    described = admin.DescribeClientQuotas(security_pb2.DescribeClientQuotasRequest(), timeout=30)
    assert {e.entity.principal for e in described.entries} >= {"User:q-once"}
    assert "User:q-twice" not in {e.entity.principal for e in described.entries}


@pytest.mark.parametrize(
    ("quota", "limit"),
    [
        (_quota("User:q-bad", "c" * 256, 10.0), "MAX_CLIENT_ID_CHARS"),
        (_quota("User:q-bad", "", float("nan")), "must be a finite number"),
        (_quota("User:q-bad", "", float("inf")), "must be a finite number"),
    ],
)
def test_a_quota_no_call_could_match_or_no_rate_can_be_is_refused(
    admin: admin_pb2_grpc.AdminStub, quota: security_pb2.ClientQuota, limit: str
) -> None:
    reply = admin.AlterClientQuotas(
        security_pb2.AlterClientQuotasRequest(entries=[quota]), timeout=30
    )
    assert reply.results[0].code == common_pb2.INVALID_REQUEST
    assert limit in reply.results[0].message
    described = admin.DescribeClientQuotas(
        security_pb2.DescribeClientQuotasRequest(principal="User:q-bad"), timeout=30
    )
    assert not described.entries
