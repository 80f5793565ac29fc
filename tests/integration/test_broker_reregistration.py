"""A restarted broker ends its previous incarnation's registration at once.

A broker SIGKILLed and started again finds its id's key in etcd still held
by the dead process's lease (it lives until its session TTL). The lease is
recorded in the data directory (`registration.json`), which only the holder
of the data directory's lock writes, so the new process revokes it and
registers at once, as Kafka's controller fences a restarted broker's
previous incarnation. A key held by any other lease (a twin on another data
directory) is still waited out.

Real etcd and real broker processes (no coordinator: registration needs
none), under a session TTL long enough (30 s) that a registration within the
deadline can only come from a revocation; the revocation itself is checked
in etcd (the old lease is gone, the key has a new one).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from tidelog_server.etcd import EtcdClient, connect
from tidelog_server.etcd.keys import Keys

from tests.support.etcd import EtcdProcess, running_etcd
from tests.support.polling import read_until
from tests.support.processes import start_broker

pytestmark = pytest.mark.timeout(180)

T = TypeVar("T")

PREFIX = "/reregistration"
#: Long: a dead incarnation's lease outlives every deadline below by far.
SESSION_TTL_S = 30
#: Generous, and still half the TTL: a new registration within it did not
#: wait for the old lease to expire (checked in etcd besides).
REREGISTER_DEADLINE_S = 15.0
#: How long a test waits for what it expects to see at all.
DEADLINE_S = 30.0
WAITING_LOG = "registered by another live process"
REVOKING_LOG = "previous incarnation's"


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    with running_etcd(tmp_path / "etcd") as process:
        yield process


def broker_args(etcd: EtcdProcess) -> list[str]:
    return ["--etcd", etcd.endpoint, "--etcd-prefix", PREFIX, "--session-ttl-s", str(SESSION_TTL_S)]


def on_etcd(etcd: EtcdProcess, operation: Callable[[EtcdClient], Awaitable[T]]) -> T:
    """`operation(client)` on a client of `etcd` of its own, from this thread."""

    async def run() -> T:
        client = connect(etcd.endpoint)
        try:
            return await operation(client)
        finally:
            await client.close()

    return asyncio.run(run())


def registration_lease(etcd: EtcdProcess, broker_id: int = 0) -> int | None:
    """The lease holding broker `broker_id`'s key; None: no key."""

    async def read(client: EtcdClient) -> int | None:
        got = await client.get(Keys(PREFIX).broker(broker_id))
        return None if got is None else int(got.lease)

    return on_etcd(etcd, read)


def lease_ttl(etcd: EtcdProcess, lease_id: int) -> int:
    """What is left of `lease_id`, in seconds; -1: it is gone."""

    async def read(client: EtcdClient) -> int:
        return int((await client.get_lease_info(lease_id, keys=False)).TTL)

    return on_etcd(etcd, read)


def grant_and_put(etcd: EtcdProcess, broker_id: int) -> int:
    """As a twin would: broker `broker_id`'s key under a lease of our own
    (SESSION_TTL_S, not refreshed); its id."""

    async def run(client: EtcdClient) -> int:
        lease = await client.lease(SESSION_TTL_S)
        await client.put(
            Keys(PREFIX).broker(broker_id), b'{"broker_id": 0, "twin": true}', lease=lease.id
        )
        return int(lease.id)

    return on_etcd(etcd, run)


def revoke(etcd: EtcdProcess, lease_id: int) -> None:
    on_etcd(etcd, lambda client: client.revoke_lease(lease_id))


def registered(etcd: EtcdProcess, deadline_s: float = DEADLINE_S) -> int:
    """Broker 0's lease, once its key is there."""
    lease = read_until(
        lambda: registration_lease(etcd), lambda got: got is not None, "registered", deadline_s
    )
    assert lease is not None
    return lease


def test_killed_broker_restarted_revokes_its_previous_lease(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    broker = start_broker(tmp_path / "broker", extra_args=broker_args(etcd))
    try:
        old = registered(etcd)
        broker.kill()
        # The dead incarnation's lease lives on (its TTL is 30 s).
        assert lease_ttl(etcd, old) > 0
        broker.spawn()
        new = read_until(
            lambda: registration_lease(etcd),
            lambda got: got is not None and got != old,
            "a registration under a new lease",
            REREGISTER_DEADLINE_S,
        )
        assert new is not None and new != old
        # Revoked, not expired: etcd knows it no more, well within its TTL.
        assert lease_ttl(etcd, old) == -1
        assert lease_ttl(etcd, new) > 0
        assert REVOKING_LOG in broker.log_path.read_text(errors="replace")
    finally:
        broker.stop()


def test_key_held_by_another_lease_is_waited_out(tmp_path: Path, etcd: EtcdProcess) -> None:
    """Even with a lease recorded in the data directory (a previous
    incarnation stopped cleanly), a key under a lease not recorded there is
    a twin's: waited out, never revoked or overwritten."""
    broker = start_broker(tmp_path / "broker", extra_args=broker_args(etcd))
    try:
        own = registered(etcd)
        assert broker.stop() == 0
        # A clean stop revoked it.
        assert lease_ttl(etcd, own) == -1
        twin = grant_and_put(etcd, broker_id=0)
        broker.spawn()
        read_until(
            lambda: broker.log_path.read_text(errors="replace"),
            lambda text: WAITING_LOG in text,
            "the broker waiting for the twin's registration",
            DEADLINE_S,
        )
        assert registration_lease(etcd) == twin
        assert lease_ttl(etcd, twin) > 0
        # The twin goes: the broker registers now.
        revoke(etcd, twin)
        mine = registered(etcd)
        assert mine not in (twin, own)
        assert REVOKING_LOG not in broker.log_path.read_text(errors="replace")
    finally:
        broker.stop()


def test_second_broker_on_the_same_data_dir_refuses_to_start(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    """Cluster mode (standalone: test_broker_lifecycle): the lock is taken
    before anything registers, so the twin neither starts nor touches the
    first one's registration."""
    data_dir = tmp_path / "broker"
    broker = start_broker(data_dir, extra_args=broker_args(etcd))
    try:
        lease = registered(etcd)
        command = [
            sys.executable, "-m", "tidelog_broker",
            "--listen", "127.0.0.1:0",
            "--data-dir", str(data_dir),
            "--broker-id", "0",
            *broker_args(etcd),
        ]  # fmt: skip
        twin = subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE_S)
        assert twin.returncode == 1, twin.stderr
        assert str(data_dir / ".lock") in twin.stderr
        assert f"pid {broker.pid}" in twin.stderr
        assert "Traceback" not in twin.stderr
        assert registration_lease(etcd) == lease
    finally:
        broker.stop()
