"""Stored credentials (salted scrypt) and quota throttle times."""

from __future__ import annotations

import asyncio

import pytest
from tidelog_server.auth import peer_host
from tidelog_server.credentials import StoredCredential, Verifier
from tidelog_server.quotas import (
    DEFAULT_PRINCIPAL,
    MAX_THROTTLE_MS,
    PRODUCER_BYTE_RATE,
    Entity,
    QuotaManager,
    check_quota_client_id,
    check_quota_values,
    decode_quota,
    encode_quota,
)


def test_a_stored_credential_holds_a_salted_hash_not_the_password() -> None:
    first = StoredCredential.create("s3cret-password")
    second = StoredCredential.create("s3cret-password")
    encoded = first.encode()
    assert b"s3cret" not in encoded
    assert first.salt != second.salt and first.key != second.key
    again = StoredCredential.decode(encoded)
    assert again.verify(b"s3cret-password")
    assert not again.verify(b"s3cret-passwore")
    with pytest.raises(ValueError, match="1 to 1024 bytes"):
        StoredCredential.create("")


def test_the_verifier_forgets_a_password_when_the_record_changes() -> None:
    async def run() -> None:
        verifier = Verifier()
        verifier.put("carol", StoredCredential.create("one"))
        assert await verifier.verify("carol", b"one")
        assert await verifier.verify("carol", b"one")  # remembered
        assert not await verifier.verify("carol", b"two")
        verifier.put("carol", StoredCredential.create("two"))
        assert not await verifier.verify("carol", b"one")
        assert await verifier.verify("carol", b"two")
        verifier.put("carol", None)
        assert not await verifier.verify("carol", b"two")
        assert not await verifier.verify("nobody", b"two")

    asyncio.run(run())


def test_peer_hosts() -> None:
    assert peer_host("ipv4:127.0.0.1:5000") == "127.0.0.1"
    assert peer_host("ipv6:[::1]:5000") == "::1"


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_throttle_time_brings_the_rate_back_to_the_quota() -> None:
    clock = _Clock()
    quotas = QuotaManager(clock)
    quotas.put(Entity("User:alice", ""), {PRODUCER_BYTE_RATE: 1000.0})
    # Under the quota: no throttle.
    assert quotas.record("User:alice", "", PRODUCER_BYTE_RATE, 500) == 0
    # 5,500 bytes at once at 1,000 B/s: wait 5.5 s.
    assert quotas.record("User:alice", "", PRODUCER_BYTE_RATE, 5000) == 5500
    clock.now += 5.5
    assert quotas.record("User:alice", "", PRODUCER_BYTE_RATE, 0) == 0
    # Never more than the cap, however far over.
    assert quotas.record("User:alice", "", PRODUCER_BYTE_RATE, 10**9) == MAX_THROTTLE_MS
    # Principals without a quota (and no default) are not measured.
    assert quotas.record("User:bob", "", PRODUCER_BYTE_RATE, 10**9) == 0


def test_the_most_specific_quota_wins() -> None:
    quotas = QuotaManager(_Clock())
    quotas.put(Entity(DEFAULT_PRINCIPAL, ""), {PRODUCER_BYTE_RATE: 1.0})
    quotas.put(Entity("User:alice", ""), {PRODUCER_BYTE_RATE: 2.0})
    quotas.put(Entity("User:alice", "etl"), {PRODUCER_BYTE_RATE: 3.0})
    assert quotas.quota_of("User:alice", "etl", PRODUCER_BYTE_RATE) == (
        Entity("User:alice", "etl"),
        3.0,
    )
    assert quotas.quota_of("User:alice", "web", PRODUCER_BYTE_RATE)[1] == 2.0  # type: ignore[index]
    assert quotas.quota_of("User:bob", "", PRODUCER_BYTE_RATE)[1] == 1.0  # type: ignore[index]
    with pytest.raises(ValueError, match="unknown quota"):
        check_quota_values({"bytes": 1.0})


# The wait for a quota this small is infinite, and int() of it raised
# OverflowError in the interceptor, for every call of the principal the
# quota named.
def test_the_smallest_quota_throttles_at_the_cap_without_overflowing() -> None:
    quotas = QuotaManager(_Clock())
    quotas.put(Entity("User:alice", ""), {PRODUCER_BYTE_RATE: 5e-324})
    assert quotas.record("User:alice", "", PRODUCER_BYTE_RATE, 1000) == MAX_THROTTLE_MS


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_quota_that_is_not_a_finite_number_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="must be a finite number"):
        check_quota_values({PRODUCER_BYTE_RATE: value})


def test_a_quota_names_a_client_id_a_call_can_carry() -> None:
    assert check_quota_client_id("c" * 255) == "c" * 255
    with pytest.raises(ValueError, match=r"at most 255 characters \(MAX_CLIENT_ID_CHARS\)"):
        check_quota_client_id("c" * 256)


@pytest.mark.parametrize("stored", [b"[1, 2]", b"3", b'{"producer_byte_rate": [1]}', b"{"])
def test_an_unreadable_stored_quota_raises_value_error(stored: bytes) -> None:
    # The services' security watch and the coordinator skip or refuse a key by
    # ValueError; any other error would escape them.
    with pytest.raises(ValueError):
        decode_quota(stored)


def test_a_stored_quota_reads_back() -> None:
    assert decode_quota(encode_quota({PRODUCER_BYTE_RATE: 1024.0})) == {PRODUCER_BYTE_RATE: 1024.0}
