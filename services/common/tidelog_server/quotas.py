"""Client quotas: byte rates and a request rate per principal (and client id).

Kafka's approach: a client over its quota is slowed down, never refused.
Each broker measures what each (principal, client id) produced, fetched and
asked in a sliding window; when a rate goes over its quota, the throttle
time is how long the client must stay silent for the window's rate to fall
back to the quota. The answer carries it (`throttle_time_ms`), and the
broker also waits that long before reading the stream's next request (or
sending its next fetch answer), so a client that ignores it is slowed all
the same.

Quotas live in etcd under `<prefix>/security/quotas/<principal>/<client id>`
(an empty client id: every client of the principal); the principal
"User:<default>" holds the default for principals without their own.
The most specific entry wins: (principal, client id), then (principal, ""),
then ("User:<default>", "").
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from tidelog_server.auth import MAX_CLIENT_ID_CHARS

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_RATE = "request_rate"
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_RATE)
DEFAULT_PRINCIPAL = "User:<default>"
#: Kafka's quota.window.num * quota.window.size.seconds (11 x 1 s).
WINDOW_S = 10.0
#: A throttle never exceeds this (Kafka caps it at the window too).
MAX_THROTTLE_MS = 10_000
#: The entities a broker keeps rates for; the oldest idle ones are forgotten.
MAX_TRACKED = 10_000
#: Trailing metadata of a unary call held back by the request-rate quota:
#: how long, in ms (streams carry `throttle_time_ms` in their answers).
THROTTLE_TIME_METADATA_KEY = "tidelog-throttle-time-ms"


def check_quota_values(values: dict[str, float]) -> dict[str, float]:
    for key, value in values.items():
        if key not in QUOTA_KEYS:
            raise ValueError(f"unknown quota {key[:64]!r}: use {', '.join(QUOTA_KEYS)}")
        if not math.isfinite(value):
            # NaN compares false with everything, so it would neither set
            # nor remove a quota; infinity is "no quota", which <= 0 says.
            raise ValueError(f"quota {key} must be a finite number, got {value}")
    return {k: float(v) for k, v in values.items() if v > 0}


def check_quota_client_id(client_id: str) -> str:
    """A client id a quota can name: at most MAX_CLIENT_ID_CHARS, the most a
    service reads from a call (a longer quota entity would match no call)."""
    if len(client_id) > MAX_CLIENT_ID_CHARS:
        raise ValueError(
            f"a quota's client id has at most {MAX_CLIENT_ID_CHARS} characters "
            f"(MAX_CLIENT_ID_CHARS), got {len(client_id)}"
        )
    return client_id


def encode_quota(values: dict[str, float]) -> bytes:
    return json.dumps(values, sort_keys=True).encode()


def decode_quota(data: bytes) -> dict[str, float]:
    """A stored quota entity's values. Raises ValueError for anything but a JSON
    object of numbers: the security watch of every service skips an unreadable
    key by that error, and must not stop at one written by hand into etcd."""
    decoded = json.loads(data)
    if not isinstance(decoded, dict):
        raise ValueError(f"a stored quota is a JSON object, got {type(decoded).__name__}")
    try:
        return {k: float(v) for k, v in decoded.items() if k in QUOTA_KEYS}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"a stored quota's values are numbers: {exc}") from None


class _Rate:
    """Amounts in a sliding window, as a deque-free pair of buckets: the
    current second and an exponentially aged total of the past."""

    __slots__ = ("started", "total")

    def __init__(self, now: float) -> None:
        self.started = now
        self.total = 0.0

    def record(self, amount: float, now: float) -> None:
        elapsed = now - self.started
        if elapsed > WINDOW_S:
            # Keep the window's share of what came before: a steady client's
            # rate stays right across the slide.
            self.total *= WINDOW_S / elapsed
            self.started = now - WINDOW_S
        self.total += amount

    def throttle_ms(self, quota: float, now: float) -> int:
        """How long to wait for total / window to drop to the quota."""
        elapsed = min(WINDOW_S, now - self.started)
        # A window of at least a second: the first request is not "infinitely fast".
        if self.total <= quota * max(1.0, elapsed):
            return 0
        # Wait w such that total / (elapsed + w) == quota. Capped before
        # int(): a quota as small as 5e-324 makes the wait infinite.
        wait_s = self.total / quota - elapsed
        return int(min(MAX_THROTTLE_MS, wait_s * 1000))


@dataclass(frozen=True, slots=True)
class Entity:
    principal: str
    client_id: str


class QuotaManager:
    """Quotas (from etcd, via `replace`/`put`) and the rates measured here.
    One event loop; not thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._quotas: dict[Entity, dict[str, float]] = {}
        self._rates: dict[tuple[Entity, str], _Rate] = {}

    def replace(self, quotas: dict[Entity, dict[str, float]]) -> None:
        self._quotas = dict(quotas)

    def put(self, entity: Entity, values: dict[str, float] | None) -> None:
        if values:
            self._quotas[entity] = values
        else:
            self._quotas.pop(entity, None)

    @property
    def enabled(self) -> bool:
        return bool(self._quotas)

    def entries(self) -> dict[Entity, dict[str, float]]:
        return dict(self._quotas)

    def quota_of(self, principal: str, client_id: str, key: str) -> tuple[Entity, float] | None:
        for entity in (
            Entity(principal, client_id),
            Entity(principal, ""),
            Entity(DEFAULT_PRINCIPAL, ""),
        ):
            values = self._quotas.get(entity)
            if values is not None and key in values:
                # Rates are measured per principal and client id asked for.
                return Entity(principal, client_id), values[key]
        return None

    def record(self, principal: str, client_id: str, key: str, amount: float) -> int:
        """Count `amount` (bytes or 1 request); the throttle time in ms."""
        found = self.quota_of(principal, client_id, key)
        if found is None:
            return 0
        entity, quota = found
        now = self._clock()
        rate = self._rates.get((entity, key))
        if rate is None:
            if len(self._rates) >= MAX_TRACKED:
                oldest = min(self._rates, key=lambda k: self._rates[k].started)
                del self._rates[oldest]
            rate = self._rates[(entity, key)] = _Rate(now)
        rate.record(amount, now)
        return rate.throttle_ms(quota, now)
