"""Connecting to etcd (one member or several), and telling "etcd is
unreachable" apart from other failures.

aetcd talks to one address. `EtcdClient` is an aetcd client that knows every
member of the cluster (`--etcd host1:2379,host2:2379,host3:2379`) and uses one
at a time, in the order given. When a call fails because that member cannot be
reached (or answers UNAVAILABLE: it lost its leader, it is stopping), the
client *fails over*: it opens a channel to the next member and

- retries the call there at once when that is safe: reads, watch creation,
  lease grant and keep-alive (etcd's clientv3 calls these "repeatable"), and
  writes that never left this process (gRPC failed to connect at all);
- raises for a write that may have reached the dead member (a transaction's
  outcome is then unknown; every caller already retries its own writes after
  an unavailable error, re-reading first where the outcome matters);
- ends the watches of the old channel, so that their owners (`PrefixWatcher`,
  `Election`) re-create them on the new member from the last seen revision.

Several failing calls of one channel fail over once (a generation counter).
With a single endpoint nothing fails over and the client behaves as aetcd's.
Members are not discovered: the list given is the list used.

TLS (`EtcdTls`): etcd's client port with `--cert-file/--key-file` and, with
`--client-cert-auth`, a client certificate signed by `--trusted-ca-file`;
etcd then takes the certificate's CN as the etcd user (its RBAC applies), so
client certificates are also how the services authenticate to etcd. aetcd
opens only insecure channels: `connect` opens the channel itself then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions
import aetcd.rpc
import aetcd.watcher
import grpc

log = logging.getLogger("tidelog.etcd.client")

T = TypeVar("T")

#: Per-call deadline: long enough for a loaded etcd, short enough that a
#: replica notices an outage within one session TTL.
ETCD_CALL_TIMEOUT_S = 5

#: Members one `--etcd` value may name. etcd clusters have 3, 5 or 7 members;
#: the bound only keeps a typo from becoming a loop over thousands of hosts.
MAX_ENDPOINTS = 16

#: gRPC codes that mean "no answer from etcd, try again later". etcd itself
#: answers UNAVAILABLE for its transient states too (no leader, request timed
#: out, leader changed, server stopping).
_UNREACHABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

#: What gRPC says when a call never left the process because no connection
#: to the member could be made (so a write can be retried elsewhere safely).
_NOT_SENT_MARKERS = ("failed to connect to all addresses", "connection refused")

_REQUIRE_LEADER = (("hasleader", "true"),)


@dataclass(frozen=True)
class EtcdTls:
    """PEM files for TLS to etcd: the authority that signed etcd's
    certificate, and this service's certificate and key (both or neither)
    for a cluster started with --client-cert-auth."""

    cafile: Path
    certfile: Path | None = None
    keyfile: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path | None, option: str) -> bytes | None:
            if path is None:
                return None
            try:
                return path.read_bytes()
            except OSError as exc:
                raise EtcdEndpointError(f"{option} {path} cannot be read: {exc.strerror}") from exc

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.cafile, "--etcd-cafile"),
            private_key=read(self.keyfile, "--etcd-keyfile"),
            certificate_chain=read(self.certfile, "--etcd-certfile"),
        )


#: How long the old channel stays open after a fail-over, so that calls
#: already in flight on it finish (or time out) instead of being cancelled.
_OLD_CHANNEL_GRACE_S = ETCD_CALL_TIMEOUT_S + 1


class EtcdEndpointError(ValueError):
    """An `--etcd` value that is not a list of host:port."""


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """`host:port[,host:port...]` -> [(host, port), ...], with clear errors."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise EtcdEndpointError(f"etcd endpoints must be host:port[,host:port...], got {text!r}")
    if len(items) > MAX_ENDPOINTS:
        raise EtcdEndpointError(
            f"{len(items)} etcd endpoints given; at most {MAX_ENDPOINTS} (MAX_ENDPOINTS)"
        )
    endpoints = []
    for item in items:
        if item.startswith("http://"):
            # etcdctl and the etcd docs spell endpoints as URLs; accept that.
            item = item.removeprefix("http://")
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise EtcdEndpointError(f"etcd endpoint must be host:port, got {item!r} in {text!r}")
        endpoints.append((host.strip("[]"), int(port)))
    return endpoints


def connect(endpoints: str, tls: EtcdTls | None = None) -> EtcdClient:
    """A client for `host:port[,host:port...]` (lazy: connects on first use)."""
    return EtcdClient(parse_endpoints(endpoints), tls)


def is_unavailable(exc: BaseException) -> bool:
    """True when `exc` means etcd could not be reached or did not answer in time.

    Those are worth retrying (and answer COORDINATOR_NOT_AVAILABLE). Anything
    else etcd answers (an invalid request, a missing lease, a permission
    error, a full database) is an application error: retrying it unchanged
    fails again, so it is reported as one, with its traceback.

    aetcd turns UNAVAILABLE into ConnectionFailedError and DEADLINE_EXCEEDED
    into ConnectionTimeoutError; a watch whose creation got no answer in time
    raises WatchTimeoutError; calls that bypass aetcd's wrappers (the raw
    stubs) raise grpc.aio.AioRpcError, judged by its code.
    """
    if isinstance(
        exc,
        aetcd.exceptions.ConnectionFailedError
        | aetcd.exceptions.ConnectionTimeoutError
        | aetcd.exceptions.WatchTimeoutError,
    ):
        return True
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in _UNREACHABLE_CODES


def _never_sent(exc: BaseException) -> bool:
    """True when the failed call surely never reached a member."""
    text = str(exc).lower()
    cause = exc.__cause__
    if isinstance(cause, grpc.aio.AioRpcError):
        text += " " + (cause.details() or "").lower()
    return any(marker in text for marker in _NOT_SENT_MARKERS)


class EtcdClient(aetcd.Client):
    """An aetcd client over a list of members, failing over between them
    (see the module doc). Not thread-safe: use from one event loop."""

    def __init__(self, endpoints: Sequence[tuple[str, int]], tls: EtcdTls | None = None) -> None:
        if not endpoints:
            raise EtcdEndpointError("at least one etcd endpoint is needed")
        # Read once, here: a missing file fails at start, naming the option.
        self._credentials = None if tls is None else tls.credentials()
        host, port = endpoints[0]
        super().__init__(
            host=host,
            port=port,
            timeout=ETCD_CALL_TIMEOUT_S,
            options={
                # Reconnect within ~0.5 s of etcd coming back, instead of gRPC's
                # default backoff that grows to two minutes: sessions (leases of a
                # few seconds) must be refreshed soon after an etcd restart.
                "grpc.initial_reconnect_backoff_ms": 100,
                "grpc.max_reconnect_backoff_ms": 500,
                "grpc.keepalive_time_ms": 10_000,
            },
        )
        self.endpoints = list(endpoints)
        #: Index in `endpoints` of the member in use.
        self.current = 0
        #: Bumped on each fail-over: a failure seen on an older channel does
        #: not move the client again.
        self.generation = 0
        self._retired: set[asyncio.Task[None]] = set()

    @property
    def endpoint(self) -> str:
        host, port = self.endpoints[self.current]
        return f"{host}:{port}"

    async def connect(self) -> None:
        """Open the channel to the member in use (no-op when open)."""
        # aetcd's connect() reads _host/_port: point it at the current member.
        self._host, self._port = self.endpoints[self.current]
        if self._credentials is None:
            await super().connect()
        elif not self._connected.is_set():
            self._open_tls_channel()
        # etcd's "require leader" (clientv3.WithRequireLeader): a member cut
        # off from the quorum answers UNAVAILABLE and ends its watches,
        # instead of serving stale reads and silent watches; we then fail over.
        self.metadata = _REQUIRE_LEADER
        if self._watcher is not None:
            self._watcher._metadata = _REQUIRE_LEADER

    def _open_tls_channel(self) -> None:
        """What aetcd's connect() does, over a TLS channel (no await inside:
        two tasks cannot both open one)."""
        assert self._credentials is not None
        target = f"{self._host}:{self._port}"
        self.channel = grpc.aio.secure_channel(
            target, self._credentials, options=list(self._options.items())
        )
        self.kvstub = aetcd.rpc.KVStub(self.channel)
        self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
        self.leasestub = aetcd.rpc.LeaseStub(self.channel)
        self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
        self._watcher = aetcd.watcher.Watcher(
            aetcd.rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
        )
        self._connected.set()

    def fail_over(self, generation: int, reason: BaseException | str) -> None:
        """Move to the next member, unless a fail-over already happened since
        `generation` (the generation the failed call was made in)."""
        if len(self.endpoints) == 1 or generation != self.generation:
            return
        failed = self.endpoint
        self.generation += 1
        self.current = (self.current + 1) % len(self.endpoints)
        log.warning("etcd member %s failed (%s); using %s", failed, reason, self.endpoint)
        channel, watcher = self.channel, self._watcher
        self._init_channel_attrs()
        self._connected.clear()
        if channel is not None:
            task = asyncio.create_task(self._retire(channel, watcher), name="etcd-retire")
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)

    async def _retire(self, channel: Any, watcher: aetcd.watcher.Watcher | None) -> None:
        # Watches end now (their owners resume on the new member); unary
        # calls in flight get their deadline before the channel closes.
        try:
            if watcher is not None:
                with contextlib.suppress(Exception):
                    await watcher.shutdown()
            await asyncio.sleep(_OLD_CHANNEL_GRACE_S)
        finally:
            # Also when close() cancels the grace: no channel is left open.
            with contextlib.suppress(Exception):
                await channel.close()

    async def close(self) -> None:
        retired = list(self._retired)
        for task in retired:
            task.cancel()
        await asyncio.gather(*retired, return_exceptions=True)
        await super().close()

    async def call(self, operation: Callable[[], Awaitable[T]], *, repeatable: bool) -> T:
        """Run `operation` on the member in use; on an unavailable member fail
        over, and retry on the next one when `repeatable` or never sent. At
        most one attempt per member, then the last error is raised."""
        for attempt in range(len(self.endpoints)):
            generation = self.generation
            try:
                return await operation()
            except Exception as exc:
                if not is_unavailable(exc):
                    raise
                self.fail_over(generation, exc)
                last_attempt = attempt == len(self.endpoints) - 1
                if last_attempt or not (repeatable or _never_sent(exc)):
                    raise
        raise AssertionError("unreachable")  # the loop returns or raises

    async def raw_kv(self, method: str, request: Any, timeout: float = ETCD_CALL_TIMEOUT_S) -> Any:
        """A read-only call on the raw KV stub (for requests aetcd cannot
        spell: limits, sort orders, revision bounds), with fail-over."""

        async def once() -> Any:
            await self.connect()
            stub_call = getattr(self.kvstub, method)
            return await stub_call(request, timeout=timeout, metadata=self.metadata)

        return await self.call(once, repeatable=True)

    async def refresh_lease(self, lease_id: int, timeout: float | None = None) -> Any:
        """One lease keep-alive, answered within `timeout` (default: the call
        timeout): a session passes less than its TTL, so that a member that
        hangs is left while the lease is still alive."""

        async def once() -> Any:
            await self.connect()
            try:
                async for reply in self.leasestub.LeaseKeepAlive(
                    [aetcd.rpc.LeaseKeepAliveRequest(ID=lease_id)],
                    timeout=timeout or self._timeout,
                    metadata=self.metadata,
                ):
                    return reply
            except aetcd.rpc.AioRpcError as exc:
                aetcd.exceptions._handle_exception(exc)
            return None

        return await self.call(once, repeatable=True)


async def raw_kv(client: aetcd.Client, method: str, request: Any) -> Any:
    """A read-only raw KV call: with fail-over on an `EtcdClient`."""
    if isinstance(client, EtcdClient):
        return await client.raw_kv(method, request)
    await client.connect()
    stub_call = getattr(client.kvstub, method)
    return await stub_call(request, timeout=ETCD_CALL_TIMEOUT_S, metadata=client.metadata)


def _wrap(name: str, repeatable: bool) -> Callable[..., Any]:
    base = getattr(aetcd.Client, name)

    async def method(self: EtcdClient, *args: Any, **kwargs: Any) -> Any:
        return await self.call(lambda: base(self, *args, **kwargs), repeatable=repeatable)

    method.__name__ = name
    method.__doc__ = base.__doc__
    return method


# Reads, watch creation and lease grants may run twice without harm (a second
# grant leaves an unused lease that expires by itself); writes may not.
for _name in ("get", "get_prefix", "get_range", "get_all", "watch", "lease", "get_lease_info"):
    setattr(EtcdClient, _name, _wrap(_name, repeatable=True))
for _name in ("put", "delete", "delete_prefix", "delete_range", "transaction", "revoke_lease"):
    setattr(EtcdClient, _name, _wrap(_name, repeatable=False))
