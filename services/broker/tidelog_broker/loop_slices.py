"""`LoopSlices`: cuts a long run of synchronous work on the event loop into
slices, yielding to the loop between them.

Everything in a broker shares one event loop, its etcd session's keepalive
too: work that holds the loop for longer than a third of the session TTL
costs the broker its registration (the controller then moves its partitions
away). Applying thousands of partition states at once (a new topic, a burst
of elections: each new leader writes its epoch history with two fsyncs) is
such work, so the code that does it calls `pause()` between partitions.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio

#: How long a run of work may hold the loop before it yields: far below the
#: keepalive's period (a third of the 2 s minimum TTL), and short enough
#: that produce and fetch requests in between see little added latency.
DEFAULT_SLICE_S = 0.02


class LoopSlices:
    """Call `await pause()` between units of work: it yields to the loop
    once the work since the last yield has held it for `slice_s`."""

    def __init__(self, slice_s: float = DEFAULT_SLICE_S) -> None:
        self.slice_s = slice_s
        self._slice_started = 0.0
        #: How many times it yielded (tests, logs).
        self.yields = 0

    async def pause(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() - self._slice_started < self.slice_s:
            return
        # sleep(0) lets every ready callback run once (a lease refresh's
        # answer, a produce request) before the work goes on.
        await asyncio.sleep(0)
        self.yields += 1
        self._slice_started = loop.time()
