"""The gRPC core transport of the services, chosen before gRPC is first imported.

Why: grpcio 1.85 serves and dials connections through its newer "event engine"
by default (the experiments `event_engine_listener` for a server's
connections, `event_engine_client` for a channel's). Each read on such a
connection is handed from an event-engine thread to the completion-queue
poller thread before it reaches grpc.aio's event loop: one thread wake-up more
per message than gRPC's long-standing transport, where the poller reads the
socket itself. On this project's 2-core machines a wake-up costs ~10 us of
CPU (perf: a third of the broker's CPU at 10,000 produce requests/s was
context switching). Measured with a producer at 10,000 records/s, linger 0
(one request per record): the broker spent 64-67 us of CPU per request with
the event-engine listener and 50-51 us without it; end to end with the
consumer in a process of its own, p99 went from 2.85-3.91 ms to 2.39-2.74 ms
in alternating runs. The client side is `tidelog._grpc_setup` (the SDK's
own choice, for the same reason).

What: `choose_transport()` adds to GRPC_EXPERIMENTS each experiment of
SERVICE_EXPERIMENTS the environment does not already name, so an operator's
explicit choice wins, experiment by experiment: `GRPC_EXPERIMENTS=
event_engine_listener` keeps gRPC's default listener. Nothing is set when gRPC
was imported already (gRPC reads the variable once, at its first import; too
late is only slower, never wrong). Each service's `__main__` imports this
module before anything else, so that the console scripts (`tidelog-broker`,
...) and `python -m` both choose in time. Child processes inherit the value.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

GRPC_EXPERIMENTS = "GRPC_EXPERIMENTS"
#: gRPC experiments the services switch off unless the environment names them.
SERVICE_EXPERIMENTS = ("-event_engine_listener", "-event_engine_client")


def completed(experiments: str) -> str:
    """`experiments` (a GRPC_EXPERIMENTS value) with each of SERVICE_EXPERIMENTS it does
    not name, on or off, appended."""
    named = {part.strip().lstrip("-") for part in experiments.split(",") if part.strip()}
    missing = [e for e in SERVICE_EXPERIMENTS if e.lstrip("-") not in named]
    if not missing:
        return experiments
    return ",".join([experiments, *missing] if experiments.strip() else missing)


def choose_transport(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Complete GRPC_EXPERIMENTS in `environ` (see module doc); whether it changed it."""
    if "grpc" in sys.modules:
        return False
    current = environ.get(GRPC_EXPERIMENTS, "")
    chosen = completed(current)
    if chosen == current:
        return False
    environ[GRPC_EXPERIMENTS] = chosen
    return True


choose_transport()
