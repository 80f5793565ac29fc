"""Ctrl-C in a blocking Consumer call (tidelog._sigint, tidelog._poll_wait):
deferred only in the main thread and only over Python's default handler (an
application's own is left alone, other threads install nothing), raised as
the outermost call ends, put back to the default when the last consumer
closes; a SIGINT ends a guarded PollEvent wait, lent loop or thread wait,
without raising into it. (With a real consumer and broker:
tests/integration/groups/test_consumer_ctrl_c.py.)"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from types import FrameType

import pytest
from tidelog import _sigint
from tidelog._poll_wait import PollEvent

pytestmark = pytest.mark.timeout(60)

#: Longer than the test's timeout: a wait that a SIGINT did not end fails it.
FOREVER_S = 600.0


@pytest.fixture
def default_sigint() -> Iterator[None]:
    """In the main thread, with SIGINT's handler Python's default for the
    test (a test runner may have set another), then as it was."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are set in the main thread only")
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
        assert not _sigint.STATE.depth and not _sigint.STATE.pending
    finally:
        signal.signal(signal.SIGINT, before)


def interrupt_main_thread() -> None:
    """SIGINT to the main thread itself (a terminal's Ctrl-C goes to the
    process, which Linux gives to the main thread when it can)."""
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


def test_a_call_off_the_main_thread_installs_nothing(default_sigint: None) -> None:
    outcome: list[bool] = []
    thread = threading.Thread(target=lambda: outcome.append(_sigint.enter()))
    thread.start()
    thread.join()
    assert outcome == [False]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_applications_own_handler_is_left_alone(default_sigint: None) -> None:
    called: list[int] = []

    def own(signum: int, frame: FrameType | None) -> None:
        called.append(signum)

    signal.signal(signal.SIGINT, own)
    _sigint.opened()
    try:
        guarded = _sigint.enter()
        assert not guarded
        try:
            signal.raise_signal(signal.SIGINT)
        finally:
            _sigint.leave(guarded)
    finally:
        _sigint.closed()
    assert called == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is own


def test_deferred_in_a_call_raised_as_it_ends_and_the_default_put_back(
    default_sigint: None,
) -> None:
    _sigint.opened()
    try:
        outer = _sigint.enter()
        assert outer and _sigint.installed()
        try:
            inner = _sigint.enter()
            try:
                signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt here
                assert _sigint.pending()
            finally:
                _sigint.leave(inner)  # not the outermost: still pending
            assert _sigint.pending()
        except KeyboardInterrupt:
            pytest.fail("raised inside the guarded call")
        with pytest.raises(KeyboardInterrupt):
            _sigint.leave(outer)
        assert not _sigint.pending()
        # Between calls, the installed handler raises at once, as the default.
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        _sigint.closed()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_handler_is_kept_while_another_consumer_is_open(default_sigint: None) -> None:
    _sigint.opened()
    _sigint.opened()
    _sigint.leave(_sigint.enter())
    _sigint.closed()
    assert _sigint.installed()
    _sigint.closed()
    assert not _sigint.installed()


def test_a_sigint_ends_a_guarded_wait_without_raising_into_it(default_sigint: None) -> None:
    event = PollEvent()
    _sigint.opened()
    timer = threading.Timer(0.2, interrupt_main_thread)
    try:
        guarded = _sigint.enter()
        try:
            timer.start()
            try:
                event.wait(FOREVER_S)
            except KeyboardInterrupt:
                pytest.fail("raised inside the wait")
            assert _sigint.pending()
            assert not event.is_set()
            event.wait(FOREVER_S)  # the interrupt still pending: no wait
        finally:
            with pytest.raises(KeyboardInterrupt):
                _sigint.leave(guarded)
    finally:
        timer.cancel()
        _sigint.closed()
