"""What the security admin RPCs store when requests race, on a real
coordinator and etcd: no AlterClientQuotas loses another's update of the
same quota entity, and no more ACL bindings, quota entities or users are
stored than the coordinator's --max-acl-bindings, --max-quota-entities and
--max-users allow, however many requests create them at once.

The coordinator runs without TLS, so the caller is User:ANONYMOUS, allowed
as long as no ACL names the cluster (these tests name topics only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from tidelog.v1 import admin_pb2_grpc, common_pb2, security_pb2
from tidelog_server.quotas import QUOTA_KEYS

from tests.support.coordinator import CoordinatorProcess, start_coordinator
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(240)

#: An entry of a request (a binding, a quota entity, a user).
E = TypeVar("E")

#: The coordinator's limits here: small, so that the tests reach them.
MAX_ACL_BINDINGS = 20
MAX_QUOTA_ENTITIES = 20
MAX_USERS = 6
#: Rounds of concurrent AlterClientQuotas on one entity, one request per
#: quota key in each: a lost update shows as a value left from the round
#: before (on the code without revision checks, most rounds lose one).
RACE_ROUNDS = 40
#: Requests racing to create bindings or entities, and what each creates:
#: together twice the limit; the race is run this many times, from none
#: stored (on code that counts without comparing, about half the rounds
#: store more than the limit).
CREATORS = 20
CREATED_EACH = 2
CREATE_ROUNDS = 10
#: The same for users (each password costs the coordinator one scrypt, ~50
#: ms of CPU: fewer than for bindings, and fewer rounds).
USER_CREATORS = 6
USER_CREATE_ROUNDS = 3
#: A request refused as retriable (the write kept losing races) is sent again,
#: at most this many times.
RESENDS_MAX = 20


@pytest.fixture(scope="module")
def coordinator(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    root: Path = tmp_path_factory.mktemp("security-admin-stored")
    process = start_coordinator(
        etcd.endpoint,
        root / "logs",
        prefix="/security-admin-stored",
        coordinator_id="c0",
        extra_args=(
            "--max-acl-bindings", str(MAX_ACL_BINDINGS),
            "--max-quota-entities", str(MAX_QUOTA_ENTITIES),
            "--max-users", str(MAX_USERS),
        ),
    )  # fmt: skip
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def admin(coordinator: CoordinatorProcess) -> Iterator[admin_pb2_grpc.AdminStub]:
    with grpc.insecure_channel(coordinator.address) as channel:
        yield admin_pb2_grpc.AdminStub(channel)


def _quota(principal: str, client_id: str, values: dict[str, float]) -> security_pb2.ClientQuota:
    return security_pb2.ClientQuota(
        entity=security_pb2.QuotaEntity(principal=principal, client_id=client_id), values=values
    )


def _binding(principal: str, topic: str) -> security_pb2.AclBinding:
    return security_pb2.AclBinding(
        resource_type="topic",
        resource_name=topic,
        principal=principal,
        operation="Read",
        permission="allow",
    )


async def _resending(
    send: Callable[[list[E]], Awaitable[list[common_pb2.Error]]], entries: list[E]
) -> list[common_pb2.Error]:
    """The result of each of `entries` sent by `send` (one request), sending
    again those refused as retriable (lost races past the coordinator's
    attempts)."""
    results: list[common_pb2.Error] = [common_pb2.Error()] * len(entries)
    pending = list(range(len(entries)))
    for _ in range(RESENDS_MAX):
        answered = await send([entries[i] for i in pending])
        for index, result in zip(pending, answered, strict=True):
            results[index] = result
        pending = [i for i in pending if results[i].code == common_pb2.COORDINATOR_NOT_AVAILABLE]
        if not pending:
            break
    return results


async def _alter_quotas(
    admin: admin_pb2_grpc.AdminStub, entries: list[security_pb2.ClientQuota]
) -> list[common_pb2.Error]:
    async def send(part: list[security_pb2.ClientQuota]) -> list[common_pb2.Error]:
        request = security_pb2.AlterClientQuotasRequest(entries=part)
        return list((await admin.AlterClientQuotas(request, timeout=60)).results)

    return await _resending(send, entries)


async def _create_acls(
    admin: admin_pb2_grpc.AdminStub, bindings: list[security_pb2.AclBinding]
) -> list[common_pb2.Error]:
    async def send(part: list[security_pb2.AclBinding]) -> list[common_pb2.Error]:
        request = security_pb2.CreateAclsRequest(creations=part)
        return list((await admin.CreateAcls(request, timeout=60)).results)

    return await _resending(send, bindings)


def _user(name: str) -> security_pb2.UserCredentialUpsert:
    return security_pb2.UserCredentialUpsert(user=name, password=f"secret-{name}")


async def _alter_users(
    admin: admin_pb2_grpc.AdminStub, upsertions: list[security_pb2.UserCredentialUpsert]
) -> list[common_pb2.Error]:
    async def send(part: list[security_pb2.UserCredentialUpsert]) -> list[common_pb2.Error]:
        request = security_pb2.AlterUserCredentialsRequest(upsertions=part)
        return [r.error for r in (await admin.AlterUserCredentials(request, timeout=60)).results]

    return await _resending(send, upsertions)


def _stored_users(admin: admin_pb2_grpc.AdminStub) -> set[str]:
    reply = admin.DescribeUserCredentials(security_pb2.DescribeUserCredentialsRequest(), timeout=30)
    return {u.user for u in reply.users}


def _remove_every_user(admin: admin_pb2_grpc.AdminStub) -> None:
    users = sorted(_stored_users(admin))
    if users:
        admin.AlterUserCredentials(
            security_pb2.AlterUserCredentialsRequest(deletions=users), timeout=30
        )


def _stored_quotas(admin: admin_pb2_grpc.AdminStub, principal: str) -> dict[str, dict[str, float]]:
    reply = admin.DescribeClientQuotas(
        security_pb2.DescribeClientQuotasRequest(principal=principal), timeout=30
    )
    return {e.entity.client_id: dict(e.values) for e in reply.entries}


def _stored_bindings(admin: admin_pb2_grpc.AdminStub) -> list[security_pb2.AclBinding]:
    return list(
        admin.DescribeAcls(
            security_pb2.DescribeAclsRequest(filter=security_pb2.AclBindingFilter()), timeout=30
        ).acls
    )


def _remove_every_binding(admin: admin_pb2_grpc.AdminStub) -> None:
    admin.DeleteAcls(
        security_pb2.DeleteAclsRequest(filters=[security_pb2.AclBindingFilter()]), timeout=30
    )


def _remove_every_quota(admin: admin_pb2_grpc.AdminStub) -> None:
    listed = admin.DescribeClientQuotas(security_pb2.DescribeClientQuotasRequest(), timeout=30)
    removals = [
        _quota(e.entity.principal, e.entity.client_id, dict.fromkeys(e.values, 0.0))
        for e in listed.entries
    ]
    if removals:
        admin.AlterClientQuotas(security_pb2.AlterClientQuotasRequest(entries=removals), timeout=30)


def test_concurrent_updates_of_one_quota_entity_lose_nothing(
    admin: admin_pb2_grpc.AdminStub, coordinator: CoordinatorProcess
) -> None:
    async def rounds() -> list[tuple[int, dict[str, float]]]:
        lost: list[tuple[int, dict[str, float]]] = []
        async with grpc.aio.insecure_channel(coordinator.address) as channel:
            stub = admin_pb2_grpc.AdminStub(channel)
            for round_number in range(1, RACE_ROUNDS + 1):
                # Each request sets one quota key of the same entity.
                answers = await asyncio.gather(
                    *(
                        _alter_quotas(stub, [_quota("User:race", "c", {key: float(round_number)})])
                        for key in QUOTA_KEYS
                    )
                )
                assert [r.code for [r] in answers] == [common_pb2.NONE] * len(QUOTA_KEYS)
                reply = await stub.DescribeClientQuotas(
                    security_pb2.DescribeClientQuotasRequest(principal="User:race"), timeout=30
                )
                stored = {e.entity.client_id: dict(e.values) for e in reply.entries}.get("c", {})
                if stored != dict.fromkeys(QUOTA_KEYS, float(round_number)):
                    lost.append((round_number, stored))
        return lost

    try:
        assert asyncio.run(rounds()) == []
    finally:
        _remove_every_quota(admin)


def _refused_by_the_limit(result: common_pb2.Error, what: str, limit: int, flag: str) -> bool:
    return (
        result.code == common_pb2.INVALID_REQUEST
        and f"more than {limit} {what}" in result.message
        and f"({flag})" in result.message
    )


def _race_to_the_limit(
    coordinator: CoordinatorProcess,
    create: Callable[[admin_pb2_grpc.AdminStub, list[E]], Awaitable[list[common_pb2.Error]]],
    wanted: list[list[E]],
    name_of: Callable[[E], Hashable],
    stored: Callable[[], set[Hashable]],
    remove_all: Callable[[], None],
    rounds: int,
    limit: tuple[int, str, str],
) -> None:
    """`rounds` times from none stored: each list of `wanted` created by its
    own request, all at once. Exactly `limit` (count, what, flag) of them are
    stored, those answered as stored, and each other is refused naming the
    limit."""
    count, what, flag = limit

    async def create_all() -> list[list[common_pb2.Error]]:
        async with grpc.aio.insecure_channel(coordinator.address) as channel:
            stub = admin_pb2_grpc.AdminStub(channel)
            return await asyncio.gather(*(create(stub, each) for each in wanted))

    remove_all()
    try:
        for _ in range(rounds):
            answers = asyncio.run(create_all())
            created = {
                name_of(entry)
                for each, results in zip(wanted, answers, strict=True)
                for entry, result in zip(each, results, strict=True)
                if result.code == common_pb2.NONE
            }
            refused = [result for results in answers for result in results if result.code]
            assert len(stored()) == count
            assert stored() == created
            assert len(refused) == sum(map(len, wanted)) - count
            for result in refused:
                assert _refused_by_the_limit(result, what, count, flag), result
            remove_all()
    finally:
        remove_all()


def test_concurrent_creates_store_no_more_acl_bindings_than_the_limit(
    admin: admin_pb2_grpc.AdminStub, coordinator: CoordinatorProcess
) -> None:
    _race_to_the_limit(
        coordinator,
        _create_acls,
        [
            [_binding(f"User:creator-{c}", f"t-{i}") for i in range(CREATED_EACH)]
            for c in range(CREATORS)
        ],
        lambda binding: (binding.principal, binding.resource_name),
        lambda: {(b.principal, b.resource_name) for b in _stored_bindings(admin)},
        lambda: _remove_every_binding(admin),
        CREATE_ROUNDS,
        (MAX_ACL_BINDINGS, "ACL bindings", "--max-acl-bindings"),
    )


def test_concurrent_creates_store_no_more_quota_entities_than_the_limit(
    admin: admin_pb2_grpc.AdminStub, coordinator: CoordinatorProcess
) -> None:
    def stored() -> set[Hashable]:
        listed = admin.DescribeClientQuotas(security_pb2.DescribeClientQuotasRequest(), timeout=30)
        return {(e.entity.principal, e.entity.client_id) for e in listed.entries}

    _race_to_the_limit(
        coordinator,
        _alter_quotas,
        [
            [
                _quota(f"User:creator-{c}", f"c-{i}", {"request_rate": 10.0})
                for i in range(CREATED_EACH)
            ]
            for c in range(CREATORS)
        ],
        lambda quota: (quota.entity.principal, quota.entity.client_id),
        stored,
        lambda: _remove_every_quota(admin),
        CREATE_ROUNDS,
        (MAX_QUOTA_ENTITIES, "quota entities", "--max-quota-entities"),
    )


def test_at_the_limit_what_adds_no_binding_or_entity_passes_and_a_removal_frees_room(
    admin: admin_pb2_grpc.AdminStub,
) -> None:
    _remove_every_binding(admin)
    _remove_every_quota(admin)
    full_bindings = [_binding("User:full", f"t-{i}") for i in range(MAX_ACL_BINDINGS)]
    full_quotas = [
        _quota("User:full", f"c-{i}", {"request_rate": 10.0}) for i in range(MAX_QUOTA_ENTITIES)
    ]
    try:
        reply = admin.CreateAcls(
            security_pb2.CreateAclsRequest(creations=full_bindings), timeout=30
        )
        assert not any(r.code for r in reply.results)
        # One more is refused; one stored already is no new binding.
        reply = admin.CreateAcls(
            security_pb2.CreateAclsRequest(
                creations=[_binding("User:full", "one-more"), full_bindings[0]]
            ),
            timeout=30,
        )
        assert _refused_by_the_limit(
            reply.results[0], "ACL bindings", MAX_ACL_BINDINGS, "--max-acl-bindings"
        )
        assert reply.results[1].code == common_pb2.NONE
        assert len(_stored_bindings(admin)) == MAX_ACL_BINDINGS
        admin.DeleteAcls(
            security_pb2.DeleteAclsRequest(
                filters=[security_pb2.AclBindingFilter(resource_name="t-0")]
            ),
            timeout=30,
        )
        reply = admin.CreateAcls(
            security_pb2.CreateAclsRequest(creations=[_binding("User:full", "one-more")]),
            timeout=30,
        )
        assert reply.results[0].code == common_pb2.NONE

        reply = admin.AlterClientQuotas(
            security_pb2.AlterClientQuotasRequest(entries=full_quotas), timeout=30
        )
        assert not any(r.code for r in reply.results)
        # A new entity is refused; a change of a stored one passes, and so
        # does a new one after a removal earlier in the same request.
        reply = admin.AlterClientQuotas(
            security_pb2.AlterClientQuotasRequest(
                entries=[
                    _quota("User:full", "new-0", {"request_rate": 10.0}),
                    _quota("User:full", "c-1", {"producer_byte_rate": 1000.0}),
                    _quota("User:full", "c-2", {"request_rate": 0.0}),
                    _quota("User:full", "new-1", {"request_rate": 10.0}),
                ]
            ),
            timeout=30,
        )
        assert _refused_by_the_limit(
            reply.results[0], "quota entities", MAX_QUOTA_ENTITIES, "--max-quota-entities"
        )
        assert [r.code for r in reply.results[1:]] == [common_pb2.NONE] * 3
        stored = _stored_quotas(admin, "User:full")
        assert len(stored) == MAX_QUOTA_ENTITIES
        assert "new-0" not in stored and "c-2" not in stored and "new-1" in stored
        assert stored["c-1"] == {"request_rate": 10.0, "producer_byte_rate": 1000.0}
    finally:
        _remove_every_binding(admin)
        _remove_every_quota(admin)


def test_concurrent_creates_store_no_more_users_than_the_limit(
    admin: admin_pb2_grpc.AdminStub, coordinator: CoordinatorProcess
) -> None:
    _race_to_the_limit(
        coordinator,
        _alter_users,
        [[_user(f"creator-{c}-{i}") for i in range(CREATED_EACH)] for c in range(USER_CREATORS)],
        lambda upsertion: upsertion.user,
        lambda: set(_stored_users(admin)),
        lambda: _remove_every_user(admin),
        USER_CREATE_ROUNDS,
        (MAX_USERS, "users", "--max-users"),
    )


def test_at_the_user_limit_a_new_password_passes_and_a_removal_frees_room(
    admin: admin_pb2_grpc.AdminStub,
) -> None:
    _remove_every_user(admin)
    full = [_user(f"full-{i}") for i in range(MAX_USERS)]
    try:
        reply = admin.AlterUserCredentials(
            security_pb2.AlterUserCredentialsRequest(upsertions=full), timeout=60
        )
        assert [r.error.code for r in reply.results] == [common_pb2.NONE] * MAX_USERS
        # A new user is refused; a stored user's new password is no new user.
        reply = admin.AlterUserCredentials(
            security_pb2.AlterUserCredentialsRequest(
                upsertions=[_user("one-more"), _user("full-0")]
            ),
            timeout=60,
        )
        assert _refused_by_the_limit(reply.results[0].error, "users", MAX_USERS, "--max-users")
        assert reply.results[1].error.code == common_pb2.NONE
        assert _stored_users(admin) == {u.user for u in full}
        # A removal in the same request makes room for a new user.
        reply = admin.AlterUserCredentials(
            security_pb2.AlterUserCredentialsRequest(
                upsertions=[_user("one-more")], deletions=["full-1", "never-stored"]
            ),
            timeout=60,
        )
        assert [(r.user, r.error.code) for r in reply.results] == [
            ("one-more", common_pb2.NONE),
            ("full-1", common_pb2.NONE),
            ("never-stored", common_pb2.INVALID_REQUEST),
        ]
        assert reply.results[2].error.message == "no user 'never-stored'"
        assert _stored_users(admin) == {u.user for u in full} - {"full-1"} | {"one-more"}
    finally:
        _remove_every_user(admin)
