"""The blocking clients' loop threads (tidelog._loop_thread): the shared loop
thread is started by its first user, kept while any client uses it, stopped
by the last, and started afresh for the next; a private one is a client's own."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading

import pytest
from tidelog._loop_thread import client_loop, shared_loop_users
from tidelog.errors import ClosedError

pytestmark = pytest.mark.timeout(60)


async def _thread_name() -> str:
    await asyncio.sleep(0)
    return threading.current_thread().name


def test_shared_handles_run_on_one_thread_until_the_last_is_stopped() -> None:
    before = shared_loop_users()
    first = client_loop("a", shared=True)
    second = client_loop("b", shared=True)
    try:
        assert first.thread is second.thread
        assert shared_loop_users() == before + 2
        assert first.run(_thread_name(), timeout=30) == second.run(_thread_name(), timeout=30)
        first.stop()
        first.stop()  # idempotent: releases its use once
        assert shared_loop_users() == before + 1
        assert second.run(_thread_name(), timeout=30) == "tidelog-loop"
        with pytest.raises(ClosedError):
            first.run(_thread_name())
    finally:
        first.stop()
        second.stop()
    if before == 0:
        assert not first.thread._thread.is_alive()
        third = client_loop("c", shared=True)
        try:
            assert third.thread is not first.thread
            assert third.run(_thread_name(), timeout=30) == "tidelog-loop"
        finally:
            third.stop()


def test_a_private_handle_has_a_thread_of_its_own() -> None:
    shared = client_loop("a", shared=True)
    private = client_loop("tidelog-producer-x", shared=False)
    try:
        assert private.thread is not shared.thread
        assert private.run(_thread_name(), timeout=30) == "tidelog-producer-x"
    finally:
        private.stop()
        shared.stop()
    assert not private.thread._thread.is_alive()


def test_a_blocking_call_from_the_shared_loop_thread_raises_instead_of_deadlocking() -> None:
    first = client_loop("a", shared=True)
    second = client_loop("b", shared=True)

    async def call_other() -> str:
        coro = _thread_name()
        try:
            second.run(coro, timeout=30)
        except RuntimeError as exc:
            return str(exc)
        return "no error"

    try:
        assert "callback thread" in first.run(call_other(), timeout=30)
    finally:
        first.stop()
        second.stop()


def _child_runs_on_a_shared_loop(out: multiprocessing.SimpleQueue) -> None:  # type: ignore[type-arg]
    handle = client_loop("child", shared=True)
    try:
        out.put(handle.run(_thread_name(), timeout=30))
    finally:
        handle.stop()


def test_a_forked_child_starts_a_shared_loop_of_its_own() -> None:
    parent = client_loop("parent", shared=True)
    try:
        # The parent's shared loop thread is not copied into the child: a
        # client there must get a loop that runs, not the parent's dead one.
        context = multiprocessing.get_context("fork")
        out = context.SimpleQueue()
        child = context.Process(target=_child_runs_on_a_shared_loop, args=(out,))
        child.start()
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join()
        assert child.exitcode == 0
        assert out.get() == "tidelog-loop"
    finally:
        parent.stop()


class _Refused(Exception):
    pass


def _refuse(*args: object, **kwargs: object) -> None:
    raise _Refused()


@pytest.mark.parametrize("client", ["producer", "consumer"])
def test_a_client_whose_construction_fails_gives_its_use_of_the_shared_loop_back(
    client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failure after the client took the shared loop (here: building its
    # sender, or its fetcher) must not leave the loop counted as in use.
    from tidelog import Consumer, Producer
    from tidelog import consumer as consumer_module
    from tidelog import producer as producer_module

    before = shared_loop_users()
    if client == "producer":
        monkeypatch.setattr(producer_module, "Sender", _refuse)
        with pytest.raises(_Refused):
            Producer("127.0.0.1:1")
    else:
        monkeypatch.setattr(consumer_module, "Fetcher", _refuse)
        with pytest.raises(_Refused):
            Consumer(bootstrap_servers="127.0.0.1:1")
    assert shared_loop_users() == before
