"""Which asyncio event loop implementation the blocking clients' loop thread runs.

Why: the blocking Producer, Consumer and AdminClient do all their gRPC work on a
private loop (tidelog._loop_thread), which the application never sees; so the
SDK may pick its implementation. uvloop (libuv, written in C) takes a record's
hops through that loop with less work than asyncio's own loop in Python:
at 10,000 records/s with the consumer in a process of its own, the end-to-end
p99 was 6-15% lower with uvloop in the clients' loops (`python -m bench.e2e_ab`,
docs/benchmarks.md). It comes with the SDK's `uvloop` extra (``pip install
'tidelog[uvloop]'``, CPython on Linux and macOS, where it has wheels); without
it asyncio's loop is used.

What: `new_event_loop()` reads TIDELOG_EVENT_LOOP once per loop it makes:

- unset or ``auto``: uvloop when it can be imported, asyncio's loop otherwise;
- ``asyncio``: asyncio's loop (to rule uvloop out when looking at a problem);
- ``uvloop``: uvloop, or an error naming the missing package.

The asyncio API (AsyncProducer, AsyncConsumer, AsyncAdminClient) runs on the
application's loop, whatever it is (``uvloop.run(main())`` gives it the same).
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Mapping

#: The environment variable naming the loop implementation (see the module doc).
EVENT_LOOP_ENV = "TIDELOG_EVENT_LOOP"

#: Its accepted values.
CHOICES = ("auto", "asyncio", "uvloop")


def new_event_loop(environ: Mapping[str, str] = os.environ) -> asyncio.AbstractEventLoop:
    """A new event loop of the implementation `environ` chooses (module doc)."""
    choice = environ.get(EVENT_LOOP_ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(
            f"{EVENT_LOOP_ENV}={environ[EVENT_LOOP_ENV]!r} is not one of {', '.join(CHOICES)}"
        )
    if choice == "asyncio":
        return asyncio.new_event_loop()
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError as exc:
        if choice == "uvloop":
            raise ValueError(
                f"{EVENT_LOOP_ENV}=uvloop but uvloop cannot be imported ({exc}): "
                "pip install 'tidelog[uvloop]', or unset the variable"
            ) from exc
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop
