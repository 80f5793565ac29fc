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

User and password (`EtcdAuth`, with etcd's `auth enable`): the client asks
etcd's Authenticate for a token and sends it as the `token` metadata of every
call, beside the require-leader metadata (aetcd's own login would replace
one with the other). etcd's tokens expire (simple tokens after
--auth-token-ttl without use, and all of them when a member restarts): a call
refused for an invalid or outdated token re-authenticates (reading the
password again, so a rotated secret is picked up) and runs once more, which
is safe for writes too, since etcd refused it before applying anything.

Refusals by etcd's RBAC (a user without a role on the cluster's prefix, a
wrong password, no user at all) raise `EtcdAccessError`, whose message names
the etcd user and what it lacks; `check_access` asks for both at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine, Sequence
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

#: Where a service reads its etcd password when no --etcd-password-file is
#: given (never from argv, which `ps` shows).
ETCD_PASSWORD_ENV = "TIDELOG_ETCD_PASSWORD"

#: What etcd answers when a token is no longer valid (expired, issued before
#: a restart, or older than the latest change of users and roles): log in
#: again and retry.
_STALE_TOKEN_MARKERS = ("invalid auth token", "revision of auth store is old")

#: What etcd answers when RBAC refuses the caller.
_REFUSED_MARKERS = (
    "permission denied",
    "user name is empty",
    "authentication failed",
    "user name not found",
)


class EtcdAccessError(Exception):
    """etcd refused this service: its user lacks a permission, or it could
    not log in. Retrying unchanged fails again: an operator must act."""


@dataclass(frozen=True)
class EtcdAuth:
    """An etcd user and where its password is read from: a file (a mounted
    Secret), else the TIDELOG_ETCD_PASSWORD environment variable. Read again
    at each login, so a rotated password file is used without a restart."""

    user: str
    password_file: Path | None = None

    def password(self) -> str:
        if self.password_file is not None:
            try:
                return self.password_file.read_text().rstrip("\r\n")
            except OSError as exc:
                raise EtcdAccessError(
                    f"--etcd-password-file {self.password_file} cannot be read: {exc.strerror}"
                ) from exc
        password = os.environ.get(ETCD_PASSWORD_ENV)
        if password is None:
            raise EtcdAccessError(
                f"--etcd-user {self.user!r} needs a password: give --etcd-password-file "
                f"or set {ETCD_PASSWORD_ENV}"
            )
        return password


def _details(exc: BaseException) -> str:
    """The text etcd answered, through aetcd's wrapping."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return (exc.details() or "").lower()
    text = str(exc)
    cause = exc.__cause__
    if isinstance(cause, grpc.aio.AioRpcError) and (cause.details() or "") not in text:
        text += " " + (cause.details() or "")
    return text.lower()


def is_stale_token(exc: BaseException) -> bool:
    return any(marker in _details(exc) for marker in _STALE_TOKEN_MARKERS)


def is_refused(exc: BaseException) -> bool:
    """True when etcd's authentication or RBAC refused the call."""
    return isinstance(exc, EtcdAccessError) or any(
        marker in _details(exc) for marker in _REFUSED_MARKERS
    )


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


def connect(endpoints: str, tls: EtcdTls | None = None, auth: EtcdAuth | None = None) -> EtcdClient:
    """A client for `host:port[,host:port...]` (lazy: connects on first use)."""
    return EtcdClient(parse_endpoints(endpoints), tls, auth)


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


class _Watcher(aetcd.watcher.Watcher):
    """aetcd's Watcher, except for a watch that etcd refuses.

    etcd answers a watch it will not serve (no permission, or a token it no
    longer knows: etcd 3.5 says "permission denied" for both) with one
    response both created and canceled, with a reason. aetcd took that for
    a watch created and waited forever for its events; here the creation
    fails with the reason, and a watch canceled later gets it as an error."""

    async def _handle_response(self, response: Any) -> None:
        if not (response.canceled and response.cancel_reason):
            await super()._handle_response(response)
            return
        error = aetcd.exceptions.ClientError(response.cancel_reason)
        async with self._lock:
            pending = self._new_callback
            if response.created and pending is not None:
                pending.error = error
                self._new_callback_ready.notify_all()
                return
            callback = self._callbacks.pop(response.watch_id, None)
        if callback is not None:
            await self._process_callback(callback, error)


class EtcdClient(aetcd.Client):
    """An aetcd client over a list of members, failing over between them
    (see the module doc). Not thread-safe: use from one event loop."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        tls: EtcdTls | None = None,
        auth: EtcdAuth | None = None,
    ) -> None:
        if not endpoints:
            raise EtcdEndpointError("at least one etcd endpoint is needed")
        # Read once, here: a missing file fails at start, naming the option.
        self._credentials = None if tls is None else tls.credentials()
        self.tls = tls
        self.auth = auth
        if auth is not None:
            auth.password()  # fails now, naming the option, when there is none
        #: etcd's token for `auth` (None: log in at the next call).
        self._token: str | None = None
        self._login = asyncio.Lock()
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
            if type(getattr(self, "_watcher", None)) is aetcd.watcher.Watcher:
                # aetcd's own, not started yet (its stream opens with the
                # first watch): ours instead (see _Watcher).
                self._watcher = self._new_watcher()
        elif not self._connected.is_set():
            self._open_tls_channel()
        if self.auth is not None and self._token is None:
            await self._log_in()
        # etcd's "require leader" (clientv3.WithRequireLeader): a member cut
        # off from the quorum answers UNAVAILABLE and ends its watches,
        # instead of serving stale reads and silent watches; we then fail over.
        metadata: tuple[tuple[str, str], ...] = _REQUIRE_LEADER
        if self._token:
            metadata += (("token", self._token),)
        self.metadata = metadata
        watcher: aetcd.watcher.Watcher | None = getattr(self, "_watcher", None)
        if watcher is not None:
            watcher._metadata = metadata

    async def _log_in(self) -> None:
        """Get a token for `auth` (one login at a time; others wait for it)."""
        assert self.auth is not None
        async with self._login:
            if self._token is not None or self.channel is None:
                return
            request = aetcd.rpc.AuthenticateRequest(
                name=self.auth.user, password=self.auth.password()
            )
            try:
                reply = await aetcd.rpc.AuthStub(self.channel).Authenticate(
                    request, timeout=self._timeout
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    # "authentication is not enabled": etcd accepts every
                    # call without a token; nothing to send.
                    log.warning(
                        "etcd at %s has authentication off; --etcd-user unused", self.endpoint
                    )
                    self._token = ""
                    return
                if exc.code() in _UNREACHABLE_CODES:
                    aetcd.exceptions._handle_exception(exc)
                raise EtcdAccessError(
                    f"etcd at {self.endpoint} refused the login of etcd user "
                    f"{self.auth.user!r}: {exc.details()}"
                ) from exc
            self._token = reply.token
            log.info("logged in to etcd at %s as %r", self.endpoint, self.auth.user)

    def _token_expired(self, stale: str | None) -> None:
        """Forget the token `stale` (unless a newer one replaced it already)
        and the watch stream that carried it: the next call logs in again and
        the watches' owners re-create them with the new token."""
        if self._token != stale:
            return
        self._token = None
        watcher: aetcd.watcher.Watcher | None = getattr(self, "_watcher", None)
        if watcher is not None:
            self._watcher = self._new_watcher()
            task = asyncio.create_task(watcher.shutdown(), name="etcd-watcher-retire")
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)

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
        self._watcher = self._new_watcher()
        self._connected.set()

    def _new_watcher(self) -> _Watcher:
        """A watch stream on the channel in use, carrying this client's
        metadata (connect() updates it after a login)."""
        return _Watcher(
            aetcd.rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
        )

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
        most one attempt per member, then the last error is raised. A call
        refused for a stale token logs in again and runs once more."""
        relogged = False
        attempt = 0
        while attempt < len(self.endpoints):
            generation = self.generation
            token = self._token
            try:
                return await operation()
            except Exception as exc:
                if self.auth is not None and not relogged and self._maybe_stale_token(exc):
                    log.info(
                        "etcd token of %r no longer valid (%s); logging in again",
                        self.auth.user,
                        _details(exc),
                    )
                    relogged = True
                    self._token_expired(token)
                    continue
                if is_refused(exc) and not isinstance(exc, EtcdAccessError):
                    raise EtcdAccessError(self.refusal(exc)) from exc
                if not is_unavailable(exc):
                    raise
                self.fail_over(generation, exc)
                last_attempt = attempt == len(self.endpoints) - 1
                if last_attempt or not (repeatable or _never_sent(exc)):
                    raise
                attempt += 1
        raise AssertionError("unreachable")  # the loop returns or raises

    def _maybe_stale_token(self, exc: BaseException) -> bool:
        """True when logging in again may cure `exc`: etcd said the token is
        invalid or outdated, or refused a watch with "permission denied",
        which etcd 3.5 also answers for a token it no longer knows."""
        return is_stale_token(exc) or "permission denied" in _details(exc)

    def etcd_user(self) -> str:
        """Who etcd takes this client for, as an operator would look it up."""
        if self.auth is not None:
            return f"etcd user {self.auth.user!r} (--etcd-user)"
        if self.tls is not None and self.tls.certfile is not None:
            common_name = _common_name(self.tls.certfile)
            return f"etcd user {common_name!r} (the CN of --etcd-certfile {self.tls.certfile})"
        return "no etcd user (give --etcd-user, or a client certificate with --etcd-certfile)"

    def refusal(self, exc: BaseException) -> str:
        """The message of an EtcdAccessError for etcd's refusal `exc`."""
        text = _details(exc).strip()
        return f"etcd at {self.endpoint} refused {self.etcd_user()}: {text}"

    async def raw_kv(
        self,
        method: str,
        request: Any,
        timeout: float = ETCD_CALL_TIMEOUT_S,
        *,
        write: bool = False,
    ) -> Any:
        """A call on the raw KV stub, with fail-over: for requests aetcd
        cannot spell (limits, sort orders, revision bounds), and for hot
        paths that build etcd's request themselves (aetcd's `transaction`
        rebuilds every operation from its own op objects on each call). A
        `write` is not sent to another member once it may have been sent.
        Errors are grpc.aio.AioRpcError, which is_unavailable judges."""

        async def once() -> Any:
            await self.connect()
            stub_call = getattr(self.kvstub, method)
            return await stub_call(request, timeout=timeout, metadata=self.metadata)

        return await self.call(once, repeatable=not write)

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


def _common_name(certfile: Path) -> str:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    try:
        certificate = x509.load_pem_x509_certificate(certfile.read_bytes())
        names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        return str(names[0].value) if names else ""
    except (OSError, ValueError):
        return "?"


#: How often `check_access` asks again while etcd cannot be reached.
_ACCESS_RETRY_S = 1.0


async def check_access(client: EtcdClient, prefix: str) -> None:
    """Return once etcd has allowed this client to read and write under
    `prefix`; raise EtcdAccessError (naming the etcd user and the prefix)
    when it refuses; ask again while etcd cannot be reached.

    The write is a transaction whose put is never applied (its comparison,
    version < 0, is never true): etcd checks the permission of every
    operation of both branches before it evaluates the comparison."""
    probe = f"{prefix.rstrip('/')}/access-check".encode()
    while True:
        try:
            await client.get(probe)
            await client.transaction(
                compare=[client.transactions.version(probe) < 0],
                success=[client.transactions.put(probe, b"")],
                failure=[],
            )
            return
        except EtcdAccessError as exc:
            if "permission denied" not in str(exc):
                raise
            raise EtcdAccessError(
                f"{exc}: it needs a role granting readwrite on the keys under "
                f"'{prefix.rstrip('/')}/' (etcdctl role grant-permission ROLE readwrite "
                f"{prefix.rstrip('/')}/ --prefix; etcdctl user grant-role USER ROLE)"
            ) from exc
        except Exception as exc:
            if not is_unavailable(exc):
                # Something else (a full etcd refuses every write): not a
                # verdict on this service's access; its own calls will say.
                log.warning("etcd access check inconclusive: %s", exc)
                return
            log.debug("etcd access check waits for etcd: %s", exc)
        await asyncio.sleep(_ACCESS_RETRY_S)


async def raw_kv(client: aetcd.Client, method: str, request: Any, *, write: bool = False) -> Any:
    """A raw KV call (`EtcdClient.raw_kv`): with fail-over on an `EtcdClient`."""
    if isinstance(client, EtcdClient):
        return await client.raw_kv(method, request, write=write)
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


async def serve_until_signal(
    start: Callable[[], Coroutine[Any, Any, None]],
    stop: Callable[[], Awaitable[None]],
    client: aetcd.Client | None,
    prefix: str,
) -> int:
    """Start a service, run it until SIGTERM or SIGINT, stop it: the exit
    status (0). Meanwhile `check_access` asks etcd whether `client` may read
    and write under `prefix`: when etcd refuses, the refusal is logged as one
    error naming the etcd user and the permission, and the service stops
    with status 1 (it cannot work without etcd, and retrying unchanged fails
    again), instead of retrying in silence or dying with a bare traceback."""
    signalled = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled.set)
    tasks: set[asyncio.Task[Any]] = {asyncio.create_task(signalled.wait(), name="signal")}
    starting = asyncio.create_task(start(), name="start")
    tasks.add(starting)
    if isinstance(client, EtcdClient):
        tasks.add(asyncio.create_task(check_access(client, prefix), name="etcd-access-check"))
    status = 0
    try:
        while not signalled.is_set():
            done, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            failed = [t for t in done if not t.cancelled() and t.exception() is not None]
            refusals = [t.exception() for t in failed if isinstance(t.exception(), EtcdAccessError)]
            if refusals:
                log.error("stopping: %s", refusals[0])
                status = 1
                break
            for task in failed:
                raise task.exception()  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if starting.cancelled() or starting.exception() is not None:
        # Stopped (a signal, a refusal) before it had started: stop what is up.
        try:
            await stop()
        except Exception:
            log.debug("stopping a service that had not finished starting", exc_info=True)
        return status
    await stop()
    return status
