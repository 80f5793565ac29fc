"""`is_unavailable` (tidelog_server.etcd.client): "etcd unreachable, retry"
versus everything else etcd answers, judged on errors from real servers.

Unreachable: nothing listening (UNAVAILABLE), a server that never answers
(the deadline passes: a call's or a watch creation's). Not unreachable: an
invalid request, a missing or duplicate lease, a permission error, and a
TimeoutError of our own.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from collections.abc import Awaitable
from pathlib import Path

import aetcd
import aetcd.exceptions
import aetcd.rpc
import grpc
import pytest
from tidelog_server.dev import etcd_binary
from tidelog_server.etcd import connect, is_unavailable

from tests.support.etcd import EtcdProcess
from tests.support.ports import free_port


async def raised(call: Awaitable[object]) -> BaseException:
    try:
        await call
    except Exception as exc:
        return exc
    raise AssertionError("the call succeeded")


def short_client(port: int) -> aetcd.Client:
    return aetcd.Client(host="127.0.0.1", port=port, timeout=1)


def test_nothing_listening_is_unavailable() -> None:
    async def run() -> None:
        client = short_client(free_port())
        try:
            error = await raised(client.get(b"k"))
            assert isinstance(error, aetcd.exceptions.ConnectionFailedError)
            assert is_unavailable(error)
            await client.connect()
            raw = await raised(client.kvstub.Range(aetcd.rpc.RangeRequest(key=b"k"), timeout=1))
            assert isinstance(raw, grpc.aio.AioRpcError)
            assert raw.code() == grpc.StatusCode.UNAVAILABLE and is_unavailable(raw)
        finally:
            await client.close()

    asyncio.run(run())


def test_a_server_that_never_answers_is_unavailable() -> None:
    """A listening socket that never speaks: the TCP connection opens, the
    HTTP/2 handshake never ends, calls and watch creations run out of time."""

    async def run() -> None:
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(16)
            client = short_client(silent.getsockname()[1])
            try:
                error = await raised(client.get(b"k"))
                assert isinstance(error, aetcd.exceptions.ConnectionTimeoutError)
                assert is_unavailable(error)
                watch_error = await raised(client.watch(b"k"))
                assert isinstance(watch_error, aetcd.exceptions.WatchTimeoutError)
                assert is_unavailable(watch_error)
            finally:
                await client.close()

    asyncio.run(run())


def test_what_etcd_answers_is_not_an_outage(tmp_path: Path) -> None:
    etcd = EtcdProcess.start(tmp_path / "etcd")

    async def run() -> None:
        client = connect(etcd.endpoint)
        try:
            missing_lease = await raised(client.put(b"k", b"v", lease=0x7E57))
            assert isinstance(missing_lease, aetcd.exceptions.ClientError)
            assert "lease not found" in str(missing_lease)
            assert not is_unavailable(missing_lease)

            lease = await client.lease(30)
            duplicate = await raised(client.lease(30, lease_id=lease.id))
            assert isinstance(duplicate, aetcd.exceptions.DuplicateLeaseError)
            assert not is_unavailable(duplicate)

            # The raw stub (as Election uses it): an empty key is invalid.
            invalid = await raised(client.kvstub.Range(aetcd.rpc.RangeRequest(key=b""), timeout=5))
            assert isinstance(invalid, grpc.aio.AioRpcError)
            assert invalid.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert not is_unavailable(invalid)

            # A timeout of our own (asyncio.wait_for) says nothing about etcd.
            own = await raised(asyncio.wait_for(asyncio.Event().wait(), 0.01))
            assert isinstance(own, TimeoutError) and not is_unavailable(own)
        finally:
            await client.close()

    try:
        asyncio.run(run())
    finally:
        etcd.stop()


def _etcdctl() -> str | None:
    beside = Path(etcd_binary()).parent / "etcdctl"
    return str(beside) if beside.exists() else shutil.which("etcdctl")


def test_a_permission_error_is_not_an_outage(tmp_path: Path) -> None:
    etcdctl = _etcdctl()
    if etcdctl is None:
        pytest.skip("no etcdctl beside etcd or on PATH")
    etcd = EtcdProcess.start(tmp_path / "etcd")
    try:
        for args in (
            ["user", "add", "root", "--new-user-password=rootpw"],
            ["user", "grant-role", "root", "root"],
            ["user", "add", "reader", "--new-user-password=readerpw"],
            ["auth", "enable"],
        ):
            subprocess.run(
                [etcdctl, f"--endpoints={etcd.endpoint}", *args],
                check=True,
                capture_output=True,
                timeout=30,
            )

        async def run() -> None:
            host, _, port = etcd.endpoint.rpartition(":")
            client = aetcd.Client(
                host=host, port=int(port), timeout=5, username="reader", password="readerpw"
            )
            try:
                denied = await raised(client.put(b"k", b"v"))
                assert "permission denied" in str(denied)
                assert not is_unavailable(denied)
                raw = await raised(
                    client.kvstub.Range(
                        aetcd.rpc.RangeRequest(key=b"k"), timeout=5, metadata=client.metadata
                    )
                )
                assert isinstance(raw, grpc.aio.AioRpcError)
                assert raw.code() == grpc.StatusCode.PERMISSION_DENIED
                assert not is_unavailable(raw)
            finally:
                await client.close()

        asyncio.run(run())
    finally:
        etcd.stop()
