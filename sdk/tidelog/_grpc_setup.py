"""gRPC core settings that must be made before gRPC is first imported.

Why: gRPC's newer client transport (the "event_engine_client" experiment, on
by default in grpcio 1.85) hands every read of a connection between its
event-engine threads before the message reaches grpc.aio. Measured on a bare
grpc.aio stream of 200 KB messages on the 2-core bench machine: ~95 us of
client CPU and ~6.5 context switches per message with it, ~50 us and ~2
without it. In the consumer (bench/fetch_profile.py, the paper's test: 200 KB
fetches): 35-55 us of client CPU and 2-4 context switches less per fetch, of
~115-175 for the whole fetch machinery. A consumer receives one message per
fetch, so this is most of the transport's share of a fetch.

What: unless GRPC_EXPERIMENTS is already in the environment, importing
tidelog sets it to "-event_engine_client", which gRPC reads once, when it is
first imported. The transport then used is gRPC's long-standing one (what
grpcio used before that experiment), for every gRPC client of the process.
Nothing changes when gRPC was imported before tidelog (the setting comes too
late; correct, only slower), or when the application set GRPC_EXPERIMENTS
itself (even to ""): to keep gRPC's default transport, set
GRPC_EXPERIMENTS="" before importing tidelog.

Import this module before anything that imports grpc.
"""

from __future__ import annotations

import os
import sys

GRPC_EXPERIMENTS = "GRPC_EXPERIMENTS"
#: gRPC experiments switched off by default (see module doc).
DEFAULT_EXPERIMENTS = "-event_engine_client"


def choose_transport(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Set GRPC_EXPERIMENTS in `environ` (see module doc); whether it did."""
    if GRPC_EXPERIMENTS in environ or "grpc" in sys.modules:
        return False
    environ[GRPC_EXPERIMENTS] = DEFAULT_EXPERIMENTS
    return True


choose_transport()
