"""The gRPC server options every Tidelog service starts its server with.

Only the ping policy lives here: what a server accepts from its clients'
keepalive pings. Each server adds its own message-size and socket options.
"""

from __future__ import annotations

#: The shortest keepalive interval a Tidelog client uses: the gateway's
#: upstream channels and the SDK's group channels ping every 5 s, also while
#: no call is active (they must notice a dead coordinator or broker within a
#: session timeout).
CLIENT_KEEPALIVE_MS = 5_000

#: By default a gRPC server allows a ping on a connection without calls only
#: every 2 hours (5 minutes with calls but no data), counts each earlier ping
#: as a strike and, after 2 strikes, closes the connection with GOAWAY
#: too_many_pings: a client idle for about two minutes then saw its next call
#: fail with UNAVAILABLE "Too many pings". So accept pings without calls, at
#: up to the clients' rate (with room for timer jitter).
KEEPALIVE_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", CLIENT_KEEPALIVE_MS // 2),
]
