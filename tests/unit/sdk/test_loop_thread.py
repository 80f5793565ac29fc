"""The blocking clients' loop threads (tidelog._loop_thread): the shared loop
thread is started by its first user, kept while any client uses it, stopped
by the last, and started afresh for the next; a private one is a client's own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import threading
import time

import pytest
from tidelog._loop_thread import LoopHandle, client_loop, shared_loop_users
from tidelog.errors import ClosedError, TidelogTimeoutError

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


def test_call_soon_racing_stop_is_dropped_not_raised() -> None:
    """A wake-up scheduled from another thread (send(), a credit grant) just
    as the client closes: it saw the loop open, then stop() closed it. It is
    dropped, as one made after close, rather than raise "Event loop is
    closed" in the application's thread."""
    thread = client_loop("tidelog-race", shared=False).thread
    thread.stop()
    assert thread.loop.is_closed()
    thread._closed = False  # the state call_soon saw before stop() ran
    ran: list[int] = []
    thread.call_soon(ran.append, 1)
    assert ran == []


async def _blocking_run_refusal(handle: LoopHandle) -> str:
    """What a blocking `handle.run()` made on the loop (as from a callback)
    raises: it must refuse rather than deadlock."""
    coro = _thread_name()
    try:
        handle.run(coro, timeout=30)
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def test_a_blocking_call_from_the_shared_loop_thread_raises_instead_of_deadlocking() -> None:
    first = client_loop("a", shared=True)
    second = client_loop("b", shared=True)
    try:
        assert "callback thread" in first.run(_blocking_run_refusal(second), timeout=30)
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


# ------------------------------------------------------------- a private loop


def test_a_private_loop_runs_in_its_own_thread_and_reports_as_run_coroutine_threadsafe() -> None:
    handle = client_loop("tidelog-private", shared=False)
    try:
        assert handle.run(_thread_name(), timeout=30) == "tidelog-private"

        async def never() -> None:
            await asyncio.Event().wait()

        with pytest.raises(TidelogTimeoutError):
            handle.run(never(), timeout=0.05)

        async def cancelled_by_another() -> None:
            current = asyncio.current_task()
            assert current is not None
            asyncio.get_running_loop().call_soon(current.cancel)
            await asyncio.Event().wait()

        with pytest.raises(concurrent.futures.CancelledError):
            handle.run(cancelled_by_another(), timeout=30)
    finally:
        handle.stop()
    assert not handle.thread._thread.is_alive()
    with pytest.raises(ClosedError):
        handle.run(_thread_name())


def test_stop_from_several_threads_at_once_ends_the_thread_once() -> None:
    handle = client_loop("tidelog-stoppers", shared=False)
    stoppers = [threading.Thread(target=handle.thread.stop) for _ in range(4)]
    for stopper in stoppers:
        stopper.start()
    for stopper in stoppers:
        stopper.join(30)
    assert handle.thread.closed
    assert not handle.thread._thread.is_alive()
    handle.stop()


def test_stop_from_a_callback_of_the_loop_ends_the_thread() -> None:
    handle = client_loop("tidelog-stop-inside", shared=False)
    handle.call_soon(handle.thread.stop)  # joins nothing: it runs in the loop's thread
    deadline = time.monotonic() + 30
    while handle.thread._thread.is_alive():
        assert time.monotonic() < deadline, "the loop's thread did not end"
        time.sleep(0.01)
    handle.stop()
