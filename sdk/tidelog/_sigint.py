"""Ctrl-C in a blocking Consumer call: a KeyboardInterrupt at a safe point.

Python raises KeyboardInterrupt at the next bytecode boundary of the main
thread, which in a script is the thread that polls. There it may land in
the poll's own calling-side work (decoding, moving positions), losing
records it took but never returned, or in a blocking call's hand-off to the
SDK's loop (a commit half submitted). (The loop itself runs in its own
thread, tidelog._loop_thread: an interrupt never lands in a task step of it.
When a Consumer alone on its loop ran the loop in the polling thread, it
could, and the consumer then silently stopped getting records.)

The decision (asyncio.Runner's idea, for a blocking API): while a Consumer
call that may do SDK work (poll(), poll_arrow(), iteration's polls,
position(), commit(), committed(), subscribe(), close(), ...: `guarded`)
runs in the main thread, SIGINT only marks an interrupt pending and wakes
the call's wait; the call raises KeyboardInterrupt itself where a wakeup()
raises WakeupError (before taking records: `check`), or as it returns
(`leave`: poll() puts back the records it took first, so none is lost). A
wait is cut short (`waiting`: the handler releases the lock the wait blocks
on: it never raises into the wait, nor takes a lock), a piece of I/O in
progress is not: commit(), close() and the like finish (each bounded by its
timeout) and then raise; so close() after a Ctrl-C still commits and leaves
the group. Outside such a call, the handler raises KeyboardInterrupt at
once, as Python's default one does. An application callback run inside a
call (a rebalance listener, a commit callback) is deferred with it.

Where, and what is left alone:
- only in the main thread (where Python runs signal handlers, and where
  signal.signal() may be called), and only while SIGINT's handler is
  Python's default (`signal.default_int_handler`): an application's own
  handler (or SIG_IGN, or asyncio.Runner's) is never replaced, and the
  consumer then behaves as before;
- installed once, by the first guarded call (not per call: two
  rt_sigaction calls per poll would cost more than the rest of this), and
  put back to the default when the last open Consumer closes in the main
  thread, unless something replaced it meanwhile. While installed, an
  asyncio.run() in the main thread sees a handler that is not the default
  and does not install its own (it then gets the plain KeyboardInterrupt).
- other threads and processes: untouched (the handler runs in the main
  thread only; a forked child keeps it and behaves as without a guard).

The Producer's blocking calls (flush(), send() waiting for buffer memory,
close()) only wait for the loop's thread, so an interrupt there only ends
the caller's wait (a threading or concurrent.futures wait), and the loop's
thread goes on sending; they are not guarded.

State is module-wide and touched by the main thread only (the handler runs
there too, between two bytecodes of whatever it was doing), so it needs no
lock; the open-consumer count does (consumers open in any thread).
"""

from __future__ import annotations

import importlib
import signal
import threading
from collections.abc import Callable
from types import FrameType

#: The main thread's ident: the only thread guarded calls defer SIGINT in.
MAIN_IDENT = threading.main_thread().ident

#: SIGINT's handler, read per guarded call: the C function under
#: signal.getsignal, which maps each answer to a Handlers enum by trying
#: (a ValueError for any function): 5 us a call against 0.16 us, and a
#: poll costs about 2 us.
_getsignal: Callable[[int], object] = importlib.import_module("_signal").getsignal


class _State:
    """What the handler and the guarded calls share (main thread only)."""

    def __init__(self) -> None:
        self.depth = 0  # guarded calls in progress in the main thread
        self.pending = False  # a SIGINT came during them, not raised yet
        # Wakes the wait in progress, from the handler: must take no lock
        # the main thread may hold (it is interrupted at any bytecode), nor
        # raise.
        self.wake: Callable[[], None] | None = None


STATE = _State()
_consumers = 0
_consumers_lock = threading.Lock()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    state = STATE
    if not state.depth:
        signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt
    state.pending = True
    wake = state.wake
    if wake is not None:
        wake()


def enter() -> bool:
    """Begin a guarded call: True when SIGINT is deferred for it (the main
    thread, the handler the default or ours), then `leave(True)` must end
    it; False elsewhere (`leave(False)` is a no-op)."""
    if threading.get_ident() != MAIN_IDENT:
        return False
    handler = _getsignal(signal.SIGINT)
    if handler is not _on_sigint:
        if handler is not signal.default_int_handler:
            return False  # the application's (or nobody's): left alone
        signal.signal(signal.SIGINT, _on_sigint)
    STATE.depth += 1
    return True


def leave(guarded: bool) -> None:
    """End a guarded call; the outermost raises a pending interrupt."""
    if not guarded:
        return
    state = STATE
    state.depth -= 1
    if not state.depth and state.pending:
        state.pending = False
        raise KeyboardInterrupt


def check() -> None:
    """At a safe point of a guarded call: raise a pending interrupt."""
    state = STATE
    if state.pending and threading.get_ident() == MAIN_IDENT:
        state.pending = False
        raise KeyboardInterrupt


def pending() -> bool:
    """Whether the calling thread's guarded call has an interrupt pending
    (a wait it ends early, for `leave` to raise)."""
    return STATE.pending and threading.get_ident() == MAIN_IDENT


def waiting(wake: Callable[[], None]) -> bool:
    """Register `wake` for the handler while a guarded call of this thread
    waits: True when registered (then `done_waiting()` after, and look at
    `pending()` once registered: an interrupt may have come just before).
    False off the main thread or outside a guarded call."""
    state = STATE
    if not state.depth or threading.get_ident() != MAIN_IDENT:
        return False
    state.wake = wake
    return True


def done_waiting() -> None:
    STATE.wake = None


def opened() -> None:
    """A Consumer opened (any thread): the handler stays while one is."""
    global _consumers
    with _consumers_lock:
        _consumers += 1


def closed() -> None:
    """A Consumer closed: the last one, closing in the main thread outside
    any guarded call, puts the default handler back (when ours is still
    installed). Closed elsewhere, ours stays: it behaves as the default."""
    global _consumers
    with _consumers_lock:
        _consumers -= 1
        last = _consumers == 0
    if (
        last
        and threading.get_ident() == MAIN_IDENT
        and not STATE.depth
        and signal.getsignal(signal.SIGINT) is _on_sigint
    ):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def installed() -> bool:
    """Whether this module's handler is SIGINT's now (for tests)."""
    return signal.getsignal(signal.SIGINT) is _on_sigint
