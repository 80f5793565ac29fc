"""The blocking clients' loop threads (tidelog._loop_thread): the shared loop
thread is started by its first user, kept while any client uses it, stopped
by the last, and started afresh for the next; a private one is a client's own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import threading
import time
from collections.abc import Callable

import pytest
from tidelog import _loop_thread
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


# ------------------------------------------------------------- lending the loop


@pytest.fixture
def long_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    """A linger no test outlasts: while it holds, only the caller runs the
    loop, so what runs where is deterministic."""
    monkeypatch.setattr(_loop_thread, "LINGER_S", 600.0)


def _lingering(name: str) -> LoopHandle:
    """A private loop lent to this thread and given back with a linger: with
    `long_linger`, nobody runs it until this thread does."""
    handle = client_loop(name, shared=False)
    if not handle.lend():
        handle.stop()
        raise AssertionError(f"a private loop with one user was not lent: {name}")
    handle.give_back(linger=True)
    return handle


def _when(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.01)


def test_a_lent_loop_runs_in_the_borrowing_thread_then_goes_back() -> None:
    handle = client_loop("tidelog-lender", shared=False)
    try:
        assert handle.lend()
        try:
            assert not handle.lend()  # lent already: one holder at a time
            ran_in = handle.loop.run_until_complete(_thread_name())
        finally:
            handle.give_back()
        assert ran_in == threading.current_thread().name
        # Given back without a linger: the loop's thread runs it again, so a
        # callback scheduled from here runs there.
        ran = threading.Event()
        names: list[str] = []
        handle.call_soon(lambda: (names.append(threading.current_thread().name), ran.set()))
        assert ran.wait(30)
        assert names == ["tidelog-lender"]
    finally:
        handle.stop()
    assert not handle.thread._thread.is_alive()


def test_a_loop_with_more_than_one_user_is_never_lent() -> None:
    private = client_loop("tidelog-two-users", shared=False)
    try:
        private.thread.set_users(2)
        assert not private.lend()
        private.thread.set_users(1)
        assert private.lend()
        private.give_back()
    finally:
        private.stop()


@pytest.mark.usefixtures("long_linger")
def test_while_the_loop_lingers_run_goes_in_the_calling_thread() -> None:
    handle = _lingering("tidelog-lingering")
    try:
        # Nobody runs the loop now: run() does not wait for the linger.
        assert handle.run(_thread_name(), timeout=30) == threading.current_thread().name

        async def never() -> None:
            await asyncio.Event().wait()

        with pytest.raises(TidelogTimeoutError):
            handle.run(never(), timeout=0.05)

        async def cancelled_by_another() -> None:
            current = asyncio.current_task()
            assert current is not None
            asyncio.get_running_loop().call_soon(current.cancel)
            await asyncio.Event().wait()

        # As run_coroutine_threadsafe's future reports a task cancelled by another.
        with pytest.raises(concurrent.futures.CancelledError):
            handle.run(cancelled_by_another(), timeout=30)
    finally:
        handle.stop()
    assert not handle.thread._thread.is_alive()


@pytest.mark.usefixtures("long_linger")
def test_a_second_user_ends_the_linger() -> None:
    handle = _lingering("tidelog-second-user")
    try:
        ran = threading.Event()
        handle.call_soon(ran.set)
        assert not ran.wait(0.2)  # lingering: nobody runs the loop
        # Another client's work must not wait on this one's next poll.
        handle.thread.set_users(2)
        assert ran.wait(30)
    finally:
        handle.stop()


def test_a_blocking_call_from_a_callback_of_a_lent_loop_raises_instead_of_deadlocking() -> None:
    handle = client_loop("tidelog-lent-callback", shared=False)
    try:
        assert handle.lend()
        try:
            refusal = handle.loop.run_until_complete(_blocking_run_refusal(handle))
            assert "callback thread" in refusal
        finally:
            handle.give_back()
    finally:
        handle.stop()


def test_another_threads_run_is_served_by_the_borrower() -> None:
    handle = client_loop("tidelog-served", shared=False)
    answered: list[str] = []
    try:
        assert handle.lend()
        try:
            asker = threading.Thread(
                target=lambda: answered.append(handle.run(_thread_name(), timeout=30))
            )
            asker.start()

            async def until_answered() -> None:
                while not answered:
                    await asyncio.sleep(0.01)

            handle.loop.run_until_complete(asyncio.wait_for(until_answered(), 30))
            asker.join(30)
        finally:
            handle.give_back()
        assert answered == [threading.current_thread().name]
    finally:
        handle.stop()


@pytest.mark.usefixtures("long_linger")
def test_stop_ends_the_thread_whether_lent_or_lingering() -> None:
    lingering = _lingering("tidelog-stop-lingering")
    lingering.stop()
    assert not lingering.thread._thread.is_alive()

    lent = client_loop("tidelog-stop-lent", shared=False)
    assert lent.lend()
    stopper = threading.Thread(target=lent.thread.stop)
    stopper.start()
    _when(lambda: lent.thread.closed, "stop() marks the loop closed")
    assert lent.thread._thread.is_alive()  # the lender still has the loop
    assert lent.loop.run_until_complete(_thread_name()) == threading.current_thread().name
    lent.give_back()
    stopper.join(30)
    assert not lent.thread._thread.is_alive()
    lent.stop()


@pytest.mark.usefixtures("long_linger")
def test_run_in_the_caller_starts_after_coroutines_submitted_before_it() -> None:
    # commit_async() then close(): the commit, submitted first, must start
    # first, as it does when the loop's thread runs the loop (found in CI:
    # close() left the group before the commit it should have waited for).
    handle = _lingering("tidelog-order")
    started: list[str] = []

    async def note(name: str) -> None:
        started.append(name)

    try:
        spawned = asyncio.run_coroutine_threadsafe(note("submitted first"), handle.loop)
        handle.run(note("run"), timeout=30)
        spawned.result(30)
        assert started == ["submitted first", "run"]
    finally:
        handle.stop()
