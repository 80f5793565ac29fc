"""The coordinator's error mapping (tidelog_coordinator.errors): an etcd
outage is COORDINATOR_NOT_AVAILABLE (the client retries), an error etcd
answers is a server error (logged with its traceback), not "retry later"."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import aetcd
import aetcd.rpc
from tidelog.v1 import common_pb2
from tidelog_coordinator.errors import error_proto
from tidelog_server.etcd import connect

from tests.support.etcd import EtcdProcess
from tests.support.ports import free_port


async def raised(call: Awaitable[object]) -> BaseException:
    try:
        await call
    except Exception as exc:
        return exc
    raise AssertionError("the call succeeded")


def code_name(error: common_pb2.Error) -> str:
    return common_pb2.ErrorCode.Name(error.code)


def test_unreachable_etcd_is_coordinator_not_available() -> None:
    async def run() -> None:
        client = aetcd.Client(host="127.0.0.1", port=free_port(), timeout=1)
        try:
            error = error_proto(await raised(client.get(b"k")), "reading a group")
        finally:
            await client.close()
        assert code_name(error) == "COORDINATOR_NOT_AVAILABLE"
        assert "etcd is not reachable while reading a group" in error.message

    asyncio.run(run())


def test_an_error_etcd_answers_is_an_unknown_server_error(etcd: EtcdProcess) -> None:
    async def run() -> None:
        client = connect(etcd.endpoint)
        try:
            await client.connect()
            invalid = await raised(client.kvstub.Range(aetcd.rpc.RangeRequest(key=b""), timeout=5))
        finally:
            await client.close()
        error = error_proto(invalid, "reading a group")
        assert code_name(error) == "UNKNOWN_SERVER_ERROR"
        assert "key is not provided" in error.message

    asyncio.run(run())
