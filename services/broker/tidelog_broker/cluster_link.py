"""A broker in cluster mode: its registration in etcd and what it learns there.

Owns everything the broker knows about etcd (the PartitionManager knows
nothing of it and only gets `host_partitions` / `drop_topic` calls):

- registration: `<prefix>/brokers/ids/<id>` = {id, host, port, rack}, bound
  to the broker's session lease (refreshed every TTL/3 by `Session`). Each
  session's lease is recorded in `<data-dir>/registration.json` (with the
  prefix, broker id and cluster id) before it registers. A key held by
  another live lease is waited out, not overwritten, unless that lease is
  the one recorded there for this prefix, broker id and cluster: then its
  holder is this broker's previous incarnation (killed less than a TTL ago),
  since only a process holding the data directory's lock (data_dir_lock.py,
  which the LogManager holds while open) writes that file, and we hold it
  now; its lease is revoked and we register at once, so the controller
  fences the dead incarnation now, not a TTL later (as Kafka's controller
  fences a restarted broker's previous epoch). Any other holder (a
  misconfigured twin with another data directory) is waited out.
  When etcd says the lease is gone (etcd lost its data, or a long outage
  outlived the TTL) a new session registers again: no restart needed;
- which partitions it hosts, and in which role: it follows
  `<prefix>/topics/` and `<prefix>/partitions/` with resumable watches. Every
  replica of a partition hosts its log; the state key's leader leads (serves
  produce and consumer fetch), the others follow it (ReplicaFetchers pull
  from the leader). Every change is reconciled into the PartitionManager:
  partitions opened or created, roles, epochs and ISR applied (`set_role`),
  configs applied (`PartitionLog.update_config`), data deleted when the
  topic is deleted or a reassignment moved the replica away; the
  replication throttle of reassignments configured. A new leader, epoch or
  ISR is applied to its partition alone; a topic change, or a state that
  appears or goes, reconciles that topic; a fresh listing, every topic;
- as leader, ISR changes the PartitionManager proposes: written to the state
  key in a transaction that compares its mod revision and its value (so its
  leader and leader epoch) with the state the change was computed from: a
  deposed leader's write fails, and the watch then tells it who leads; so
  does a change computed before the watch applied the latest state. A
  replica joining the ISR must also still hold the registration its fetches
  were bound to (its key's create revision), so a broker whose lease expired
  meanwhile does not join, and so must the leader (no write lands after its
  registration is gone). The joining replica's registration must also still
  say what the view says of it (its key's mod revision), which does not
  list the replica offline: an offline log is listed by a rewrite in place
  (below), which keeps the create revision, and a leader whose watch had
  not brought it yet would put the offline replica back into the ISR that
  the controller keeps it out of. Writes under way when the broker stops
  are cancelled before it deregisters;
- which brokers and coordinators are live, which topics and partition
  states exist: the watches keep one typed view of them (`view`,
  tidelog_server.etcd.cluster_view); replica fetches and ISR expansion are bound to
  a live broker's registration (`ClusterView.registration_of`);
- offline replicas: a log that a storage failure took offline
  (`PartitionLog.offline`), or that could not be opened (hosted as an
  `UnopenedLog`, the topic's other partitions hosted as usual), is listed
  in the registration's
  `offline_partitions`, rewritten in place (same key, same lease, compared
  by its create revision, so the registration stays the same incarnation)
  whenever the set changes; the controller then elects none of them and
  drops them from the ISR, and moves leadership off one that led (Kafka's
  broker reports its failed log directories to the controller). At most
  MAX_OFFLINE_REPORTED are listed (a bound on the registration's size).
  So are the partitions of a topic whose hosting failed as a whole (below),
  while it does. It and the torn replicas' rewrite (below) are the only
  rewrites in place (host, ports and resources are written once per
  registration), so an ISR expansion that it refuses (see above)
  is refused only when this broker's offline or torn logs changed: the leader's next
  qualifying fetch, once its watch brought the rewrite, proposes it again;
- torn replicas: a log that may have lost its tail at its open (the
  broker was not shut down cleanly, or recovery cut damage) and that has
  neither caught up with a leader nor led since (LogManager.torn_partitions:
  after a kill, every log of the broker) is listed in
  `torn_partitions`, and its figures (last epoch, log end offset) in
  `torn_figures`, by the same rewrite, when the set changes and whenever a
  torn log's partition state changes (its figures move while it follows or
  leads, and are final once the partition is leaderless: what the
  controller compares, when every ISR member is torn, to elect the one
  holding the most). Not at each append: a rewrite wakes every watcher of
  brokers/, and may make an ISR expansion of this broker fail once (above);
- failed hostings: a topic whose partitions could not be hosted as a whole
  (out of descriptors or memory, which `LogManager._open_logs` does not
  take for a fault of one directory; or refused past max.partitions) is
  reconciled again after HOSTING_RETRY_INITIAL_S, then twice as long each
  time up to HOSTING_RETRY_MAX_S, for as long as it fails and is in etcd;
  no change of the topic in etcd is needed (`_retry_hostings`). A change
  of it (a partition added, a config, a reassignment) is new information:
  reconciled at once, as any, and, failing, waits HOSTING_RETRY_INITIAL_S
  again (only the timer's retries double the wait, as Kafka resets a
  backoff on new input). Its hosted partitions that etcd no longer has
  here (a reassignment moved them away) are closed, and their logs
  deleted, before each attempt, so also when it fails (`_drop_unassigned`);
- the lease: a leader writes only while its session's lease is surely alive
  (`Session.valid`), so a broker cut off from etcd stops accepting writes
  before the controller can elect another leader (no split brain);
- where calls to a coordinator go (`forwarding`, over the broker's channel
  pool). The answers built from the view (Metadata, DescribeCluster) are
  cluster_servicers'.

Logs of topics deleted while the broker was down are found at the first
listing and deleted, but only when `<data-dir>/cluster.json` says the data
directory belongs to this cluster (same cluster id): a broker pointed at the
wrong etcd prefix must never delete data. The file also records each hosted
topic's id, so a topic deleted and re-created under the same name while the
broker was down does not inherit the old records.

Not thread-safe: everything runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aetcd
from tidelog.errors import StorageError, TidelogError
from tidelog_server.atomic_files import Durability, write_atomically
from tidelog_server.election_rule import next_elr
from tidelog_server.etcd import (
    PrefixWatcher,
    Session,
    WatchBatch,
    connect,
    is_unavailable,
)
from tidelog_server.etcd.client import EtcdAccessError, EtcdAuth, EtcdTls
from tidelog_server.etcd.cluster_id import ensure_cluster_id
from tidelog_server.etcd.cluster_view import ClusterView, KnownState, KnownTopic
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import BrokerRegistration, PartitionState, Reassignment
from tidelog_server.forwarding import ChannelPool, CoordinatorForwarding
from tidelog_server.log_flood import RateLimitedLog

from tidelog_broker.config import BrokerConfig
from tidelog_broker.loop_slices import LoopSlices
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.replica_fetcher import ReplicaFetchers
from tidelog_broker.replica_state import PartitionReplication, Role
from tidelog_broker.topic_store import TopicSpec

log = logging.getLogger("tidelog.broker.cluster")
# Errors that loops repeat (per partition, per pass) log once per interval.
flood = RateLimitedLog(log)

#: Pause between attempts while etcd is unreachable or our id is taken.
RETRY_DELAY_S = 0.5
_META_FILE = "cluster.json"
#: The lease of our latest session, so that the next incarnation knows it
#: (`_record_lease`, `_is_previous_incarnation`).
REGISTRATION_FILE = "registration.json"
#: Leases it keeps, newest first (`_record_lease`).
RECORDED_LEASES = 3
#: Offline replicas listed in the registration at most: with topic names of
#: up to 249 characters, ~260 KB, well within etcd's default request limit
#: (1.5 MiB). Beyond it, the others leave the ISR only as lagging replicas
#: (replica.lag.time.max.ms), as before the registration listed any.
#: Torn replicas are listed up to the same bound (and their figures with
#: them; the three lists stay well under 1 MB). Every log of a broker that
#: was killed is torn until it catches up or leads, so a broker hosting more
#: replicas than this lists only the first (those whose recovery found a
#: loss first: LogManager.torn_figures): the others look whole to the
#: controller, which may elect one while an ISR member that kept more may
#: still return, as before a crash alone made a log torn. Each leaves the
#: list as it catches up, and the next rewrite lists the ones after it.
MAX_OFFLINE_REPORTED = 1000
#: A topic whose hosting failed (`_hosting_failed`) is reconciled again
#: after this long, then after twice as long each time it fails again, at
#: most HOSTING_RETRY_MAX_S: a descriptor shortage is often over in seconds,
#: and one that lasts costs a failed attempt (a few opens, a WARNING line at
#: most once a minute, RateLimitedLog) per topic every 30 s.
HOSTING_RETRY_INITIAL_S = 1.0
HOSTING_RETRY_MAX_S = 30.0


@dataclass(frozen=True)
class _FailedHosting:
    """A topic whose hosting failed: what is not hosted, and when to retry."""

    #: Of the partitions this broker is a replica of, those not hosted
    #: (listed offline in the registration meanwhile).
    unhosted: frozenset[int]
    #: The wait before this retry; if it fails, the next waits twice as
    #: long (a change of the topic in etcd starts over: `_hosting_did_fail`).
    delay_s: float
    #: Event-loop time of the next attempt.
    due: float


@dataclass(frozen=True)
class ClusterConfig:
    """How a broker joins a cluster (`tidelog-broker --etcd ...`)."""

    #: etcd endpoint, host:port.
    etcd_endpoint: str
    #: Key prefix of the cluster in etcd (the coordinator's --prefix).
    etcd_prefix: str = "/tidelog"
    #: broker.rack: placement spreads replicas across racks.
    rack: str = ""
    #: The registration lease: a broker that dies disappears this long after
    #: (and the partitions it led get new leaders then: the fail-over time).
    session_ttl_s: int = 2
    #: TLS to etcd (None: plain text).
    etcd_tls: EtcdTls | None = None
    #: etcd user and password (None: none, or the CN of the TLS certificate).
    etcd_auth: EtcdAuth | None = None


#: Torn partitions a registration rewrite's log line names at most: after a
#: kill every log of the broker is torn, and the rewrites as they catch up
#: one by one would each name up to MAX_OFFLINE_REPORTED.
_TORN_NAMED_MAX = 20


def _named(partitions: tuple[tuple[str, int], ...]) -> str:
    """`partitions` as `[t-0, t-1]`, at most _TORN_NAMED_MAX named, then
    how many more."""
    names = [f"{t}-{p}" for t, p in partitions[:_TORN_NAMED_MAX]]
    more = len(partitions) - len(names)
    return f"[{', '.join(names)}{f', and {more} more' if more else ''}]"


class ClusterLink:
    """The broker's view of the cluster in etcd (see module doc)."""

    def __init__(
        self,
        cluster: ClusterConfig,
        broker: BrokerConfig,
        manager: PartitionManager,
        channels: ChannelPool,
    ) -> None:
        self.cluster = cluster
        self.broker = broker
        self.manager = manager
        self.keys = Keys(cluster.etcd_prefix)
        self.client: aetcd.Client = connect(
            cluster.etcd_endpoint, cluster.etcd_tls, cluster.etcd_auth
        )
        self.host = broker.advertised_host or broker.host
        self.port = broker.port
        self.internal_port: int | None = None
        #: Live brokers, coordinators, topics and partition states (the watches).
        self.view = ClusterView(self.keys)
        #: Set once registered (tests, logs); cleared while re-registering.
        self.registered = asyncio.Event()
        self.cluster_id = ""
        #: etcd revision of our registration: a leadership written before it
        #: belongs to a previous incarnation (maybe with a torn log), so it is
        #: not taken up until the controller confirms it with a new state.
        self.registration_revision = 0
        self._session: Session | None = None
        #: The registration value last written (by `_register` or
        #: `_publish_offline`): what the controller knows of our offline logs.
        self._registered_value = b""
        # Set when the offline logs may have changed (from any thread).
        self._offline_changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._meta_path = broker.data_dir / _META_FILE
        self._registration_path = broker.data_dir / REGISTRATION_FILE
        #: What `registration.json` said at start: our previous incarnations'.
        self._previous: dict[str, object] = {}
        #: What it says now (what we last wrote).
        self._recorded: dict[str, object] = {}
        self._local_ids: dict[str, str] = {}
        self._local_cluster_id = ""
        self._strays_checked = False
        #: The logs etcd assigns us are not all hosted yet: the registration
        #: says `starting` (its torn partitions are not known yet), and the
        #: controller elects us nowhere. Cleared after the first reconcile
        #: with the topics and the states listed.
        self._starting = True
        # Both listings, topics and partition states (two watches, in either
        # order), come before the stray check: a replica moved away is told
        # from one being created by its state.
        self._topics_listed = False
        self._states_listed = False
        # Topics whose hosting failed or was refused, until a reconcile of
        # theirs succeeds (retried: `_retry_hostings`) or they are deleted:
        # they may have left directories the manager does not know of (see
        # _reconcile).
        self._hosting_failed: dict[str, _FailedHosting] = {}
        # Set when `_hosting_failed` changed: `_retry_hostings` looks again.
        self._hosting_failures_changed = asyncio.Event()
        #: Of each hosted topic, the partitions followed here: partition ->
        #: (leader, leader epoch); and the reassignments throttled here.
        self._followed: dict[str, dict[int, tuple[int, int]]] = {}
        self._throttled: dict[str, dict[int, Reassignment]] = {}
        # Hosting awaits (logs open in worker threads, long walks yield to
        # the loop), so the topics and states watches and the registration
        # take turns: each applies its change to the view and reconciles it
        # whole, never seeing another's half done.
        self._hosting = asyncio.Lock()
        self._slices = LoopSlices()
        self._watchers = [
            PrefixWatcher(self.client, self.keys.brokers, self._on_brokers, name="brokers"),
            PrefixWatcher(
                self.client, self.keys.coordinators, self._on_coordinators, name="coordinators"
            ),
            PrefixWatcher(self.client, self.keys.topics, self._on_topics, name="topics"),
            PrefixWatcher(
                self.client, self.keys.all_partition_states, self._on_states, name="partitions"
            ),
        ]
        self._tasks: list[asyncio.Task[None]] = []
        #: Calls to coordinator replicas (auto-creation, forwarded calls)
        #: over the broker's channels, which the broker's stop closes.
        self.forwarding = CoordinatorForwarding(channels, self.view.coordinator_addresses)
        self.fetchers = ReplicaFetchers(
            manager.replicas, broker, self.view.broker_internal_address, self.lease_valid
        )
        manager.replicas.lease_valid = self.lease_valid
        manager.replicas.isr_writer = self.write_isr
        manager.replicas.registration_of = self.view.registration_of
        manager.replicas.replica_offline = self.view.lists_offline
        manager.logs.cluster_partition_count = self._partition_count
        manager.logs.on_offline_changed = self._on_offline_changed

    # ------------------------------------------------------------ lifecycle

    async def start(self, port: int, internal_port: int | None = None) -> None:
        """Register (in the background, retried) and follow etcd."""
        self.port = port
        self.internal_port = internal_port
        self._load_meta()
        self._previous = self._recorded = self._load_recorded_lease()
        self._loop = asyncio.get_running_loop()
        self._tasks = [
            asyncio.create_task(self._registration(), name="broker-registration"),
            asyncio.create_task(self._publish_offline(), name="broker-offline-partitions"),
            asyncio.create_task(self._retry_hostings(), name="broker-hosting-retries"),
            *(asyncio.create_task(w.run(), name=f"watch-{w.name}") for w in self._watchers),
        ]

    async def wait_synced(self, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            for watcher in self._watchers:
                await watcher.synced.wait()

    def in_sync(self) -> bool:
        """Registered, caught up with etcd, and in the ISR of every partition
        it hosts that has a live leader: stopping this broker now costs no
        partition more than this one replica (what a rolling restart and a
        PodDisruptionBudget must know before taking the next broker down)."""
        return (
            self.registered.is_set()
            and all(watcher.synced.is_set() for watcher in self._watchers)
            and not self.view.out_of_sync(self.broker.broker_id)
        )

    async def stop(self) -> None:
        """Revoke the session (the broker disappears from the cluster now)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.fetchers.close()
        # Before the registration goes: an ISR write left running would
        # retry against a closed client, logging errors till the loop ends.
        await self.manager.replicas.stop_isr_writes()
        if self._session is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._session.close()
        with contextlib.suppress(Exception):
            await self.client.close()

    # ------------------------------------------------------------ registration

    def _registration_value(self) -> bytes:
        offline = sorted(
            {
                *self.manager.logs.offline_partitions(),
                *(
                    (name, p)
                    for name, failed in self._hosting_failed.items()
                    for p in failed.unhosted
                ),
            }
        )
        if len(offline) > MAX_OFFLINE_REPORTED:
            flood.warning(
                "%d partition logs are offline; the registration lists the first %d",
                len(offline),
                MAX_OFFLINE_REPORTED,
            )
            offline = offline[:MAX_OFFLINE_REPORTED]
        # Beyond the bound, see MAX_OFFLINE_REPORTED.
        torn = self.manager.logs.torn_figures()[:MAX_OFFLINE_REPORTED]
        return BrokerRegistration(
            broker_id=self.broker.broker_id,
            host=self.host,
            port=self.port,
            rack=self.cluster.rack,
            # Resources (resources.py): coordinators refuse topics whose
            # replicas would pass a broker's max_partitions.
            max_partitions=self.manager.logs.partition_capacity,
            open_file_limit=self.manager.logs.open_file_limit,
            internal_port=self.internal_port,
            offline_partitions=tuple(offline),
            torn_partitions=tuple((t, p) for t, p, _, _ in torn),
            torn_figures=tuple(torn),
            starting=self._starting,
        ).encode()

    def _on_offline_changed(self) -> None:
        """LogManager.on_offline_changed: may run on a worker thread."""
        if self._loop is not None:
            # RuntimeError: the loop closed (the broker stopped meanwhile).
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._offline_changed.set)

    async def _publish_offline(self) -> None:
        """Rewrite the registration whenever the offline logs change (see
        the module doc); retried while etcd is unreachable."""
        while True:
            await self._offline_changed.wait()
            self._offline_changed.clear()
            try:
                await self._rewrite_registration()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not is_unavailable(exc):
                    flood.exception("publishing the offline partitions failed")
                await asyncio.sleep(RETRY_DELAY_S)
                self._offline_changed.set()

    async def _rewrite_registration(self) -> None:
        """Put the current registration value in place of the one written
        last, if it differs, under the same registration (its create
        revision) and lease. Not registered: `_register` writes the current
        value, and sets `_offline_changed` once registered."""
        session = self._session
        if session is None or not self.registered.is_set():
            return
        value = self._registration_value()
        if value == self._registered_value:
            return
        key = self.keys.broker(self.broker.broker_id)
        tx = self.client.transactions
        ok, _ = await self.client.transaction(
            compare=[tx.create(key) == self.registration_revision],
            success=[tx.put(key, value, lease=session.lease_id)],
            failure=[],
        )
        if not ok:
            return  # the registration is gone: the next one lists them
        self._registered_value = value
        listed = BrokerRegistration.decode(value)
        # Nothing listed (its logs all hosted, none offline or torn): news,
        # not a warning.
        level = (
            logging.WARNING if listed.offline_partitions or listed.torn_partitions else logging.INFO
        )
        log.log(
            level,
            "broker %d registration now lists offline partitions %s, torn partitions %s%s",
            self.broker.broker_id,
            [f"{t}-{p}" for t, p in listed.offline_partitions],
            _named(listed.torn_partitions),
            " (starting: its logs are not all hosted yet)" if listed.starting else "",
        )

    async def _registration(self) -> None:
        while True:
            try:
                if self._session is None or self._session.lost.is_set():
                    self._session = await Session.create(self.client, self.cluster.session_ttl_s)
                await self._ensure_cluster_id()
                self._record_lease(self._session.lease_id)
                if not await self._register(self._session):
                    await asyncio.sleep(RETRY_DELAY_S)
                    continue
                self.registered.set()
                # A log that went offline while registering: published now.
                self._offline_changed.set()
                log.info(
                    "broker %d registered in etcd %s under %s (lease %x)",
                    self.broker.broker_id,
                    self.cluster.etcd_endpoint,
                    self.keys.prefix,
                    self._session.lease_id,
                )
                await self._session.lost.wait()
                self.registered.clear()
                log.warning(
                    "broker %d lost its etcd session; registering again", self.broker.broker_id
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, EtcdAccessError):
                    # etcd's RBAC: its words say it; no traceback.
                    flood.error("registering broker %d: %s", self.broker.broker_id, exc)
                elif not is_unavailable(exc):
                    flood.exception("registering broker %d failed", self.broker.broker_id)
                else:
                    log.info("etcd unreachable (%s); retrying registration", exc)
                await asyncio.sleep(RETRY_DELAY_S)

    async def _register(self, session: Session) -> bool:
        """Put our key bound to `session`; False while another lease holds it."""
        key = self.keys.broker(self.broker.broker_id)
        tx = self.client.transactions
        value = self._registration_value()

        async def put_if_absent() -> tuple[bool, Any]:
            ok, responses = await self.client.transaction(
                compare=[tx.create(key) == 0],
                success=[tx.put(key, value, lease=session.lease_id)],
                failure=[tx.get(key)],
            )
            return ok, responses

        ok, responses = await put_if_absent()
        if not ok:
            holder = responses[0][0][1]
            if holder.lease != session.lease_id and self._is_previous_incarnation(holder.lease):
                await self._revoke_previous_incarnation(holder.lease)
                ok, responses = await put_if_absent()
        if ok:
            revision = responses[0].response_put.header.revision
        else:
            holder = responses[0][0][1]
            if holder.lease != session.lease_id:
                log.warning(
                    "broker id %d is registered by another live process (lease %x, %s); waiting "
                    "for it to go away (a previous incarnation disappears within its session "
                    "TTL)",
                    self.broker.broker_id,
                    holder.lease,
                    holder.value.decode(errors="replace"),
                )
                return False
            revision = holder.create_revision
            value = holder.value
        self._registered_value = value
        async with self._hosting:
            # Leaderships written before it were a previous incarnation's.
            self.registration_revision = revision
            await self._reconcile(full_listing=False)
        return True

    # ------------------------------------------------------------ registration.json

    def _record_lease(self, lease_id: int) -> None:
        """Record `lease_id` as ours (see module doc), before it registers:
        a kill between the registration and this write would leave the next
        incarnation to wait out the lease. Written only while we hold the
        data directory's lock (the LogManager took it at open). The leases
        recorded before it (of this prefix, broker id and cluster) are kept,
        RECORDED_LEASES in all: an incarnation killed after recording its
        lease but before registering leaves the key to the one before it."""
        earlier = [lease for lease in self._recorded_leases(self._recorded) if lease != lease_id]
        record: dict[str, object] = {
            "etcd_prefix": self.keys.prefix,
            "broker_id": self.broker.broker_id,
            "cluster_id": self.cluster_id,
            "leases": [lease_id, *earlier][:RECORDED_LEASES],
        }
        if record == self._recorded:
            return
        try:
            self._registration_path.parent.mkdir(parents=True, exist_ok=True)
            # Rename only, no fsync: the record matters when this process
            # died and its machine did not (SIGKILL, OOM kill, a crash): the
            # page cache keeps the write and the rename is atomic to every
            # other process. After a machine crash it may be lost or torn:
            # read as absent, the next incarnation then waits out the old
            # lease, as it did before there was a record (a reboot mostly
            # outlasts the TTL anyway). An older record names a lease of
            # ours too, so it can never make us revoke another's.
            write_atomically(
                self._registration_path,
                json.dumps(record, sort_keys=True).encode("utf-8"),
                Durability.NONE,
            )
        except OSError as exc:
            log.error(
                "cannot write %s: %s (a restart will wait out this lease's TTL)",
                self._registration_path,
                exc,
            )
            return
        self._recorded = record

    def _load_recorded_lease(self) -> dict[str, object]:
        try:
            raw = json.loads(self._registration_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable %s: %s", self._registration_path, exc)
            return {}
        return raw if isinstance(raw, dict) else {}

    def _recorded_leases(self, record: dict[str, object]) -> list[int]:
        """The leases `record` lists, if it is of our prefix, broker id and
        cluster (known only once `_ensure_cluster_id` ran); else none."""
        leases = record.get("leases")
        if (
            not self.cluster_id
            or record.get("etcd_prefix") != self.keys.prefix
            or record.get("broker_id") != self.broker.broker_id
            or record.get("cluster_id") != self.cluster_id
            or not isinstance(leases, list)
        ):
            return []
        return [lease for lease in leases if isinstance(lease, int)]

    def _is_previous_incarnation(self, lease_id: int) -> bool:
        """`lease_id` is one our data directory recorded, before this
        process started, for this prefix, broker id and cluster: a previous
        incarnation's (see module doc)."""
        return lease_id in self._recorded_leases(self._previous)

    async def _revoke_previous_incarnation(self, lease_id: int) -> None:
        """Revoke our previous incarnation's lease: its registration (and
        any key it bound to the lease) goes now, not a TTL later."""
        log.info(
            "broker id %d is registered by lease %x, which %s records as this broker's "
            "previous incarnation's (it held this data directory's lock, which we hold "
            "now): revoking that lease and registering at once",
            self.broker.broker_id,
            lease_id,
            self._registration_path,
        )
        try:
            await self.client.revoke_lease(lease_id)
        except Exception as exc:
            if is_unavailable(exc):
                raise
            # Gone meanwhile (it expired): the put that follows tells.
            log.info("revoking lease %x: %s", lease_id, exc)

    async def _ensure_cluster_id(self) -> None:
        if self.cluster_id:
            return
        self.cluster_id = await ensure_cluster_id(self.client, self.keys)
        if not self._local_cluster_id:
            self._local_cluster_id = self.cluster_id
            self._save_meta()
        elif self._local_cluster_id != self.cluster_id:
            log.error(
                "data dir %s belongs to cluster %s, but etcd prefix %s holds cluster %s: "
                "stray logs will not be deleted",
                self.broker.data_dir,
                self._local_cluster_id,
                self.keys.prefix,
                self.cluster_id,
            )

    # ------------------------------------------------------------ cluster.json

    def _load_meta(self) -> None:
        try:
            raw = json.loads(self._meta_path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable %s: %s", self._meta_path, exc)
            return
        self._local_cluster_id = str(raw.get("cluster_id", ""))
        self._local_ids = {str(k): str(v) for k, v in raw.get("topics", {}).items()}

    def _save_meta(self) -> None:
        body = {"cluster_id": self._local_cluster_id, "topics": self._local_ids}
        try:
            self._meta_path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(
                self._meta_path, json.dumps(body, indent=2, sort_keys=True).encode("utf-8")
            )
        except OSError as exc:
            log.error("cannot write %s: %s", self._meta_path, exc)

    # ------------------------------------------------------------ watches

    async def _on_brokers(self, batch: WatchBatch) -> None:
        self.view.apply_brokers(batch)

    async def _on_coordinators(self, batch: WatchBatch) -> None:
        self.view.apply_coordinators(batch)

    async def _on_topics(self, batch: WatchBatch) -> None:
        async with self._hosting:
            self.view.apply_topics(batch)
            if batch.reset:
                await self._reconcile(full_listing=True)
                return
            await self._reconcile(
                full_listing=False,
                topics={self.keys.tail(c.key, self.keys.topics) for c in batch.changes},
            )

    async def _on_states(self, batch: WatchBatch) -> None:
        async with self._hosting:
            await self._apply_states(batch)
        # etcd's watch brings a new topic's states back to back, with no
        # wait in between: each batch ends its slice if it has run long.
        await self._slices.pause()

    async def _apply_states(self, batch: WatchBatch) -> None:
        if batch.reset:
            self.view.apply_states(batch)
            self._states_listed = True
            await self._reconcile(full_listing=False)
            return
        changed: dict[str, set[int]] = {}
        for change in batch.changes:
            tp = self.keys.parse_partition_state_key(change.key)
            if tp is not None:
                changed.setdefault(tp.topic, set()).add(tp.partition)
        existed = self._states_present(changed)
        self.view.apply_states(batch)
        # A new leader, epoch or ISR of an existing state (nearly every
        # change) touches only its partition, and states that appear in a
        # topic already hosted here (a new topic's, arriving over many
        # batches; added partitions) only theirs: a broker hosting thousands
        # of partitions must not walk all of them for each batch. It did:
        # under a burst of elections its event loop starved its lease
        # refreshes, and a new topic of 3,000 partitions, whose states came
        # then in ~1,900 batches (one per event; since the watcher batches
        # what it has received, ~24), was walked each time. A state that
        # went, or a topic not hosted as etcd says, reconciles the whole topic.
        hosting: set[str] = set()
        appeared: dict[str, frozenset[int]] = {}
        for name, present in self._states_present(changed).items():
            if present == existed[name]:
                continue
            if existed[name] <= present and self._hosts_as_listed(name):
                appeared[name] = present - existed[name]
            else:
                hosting.add(name)
        if hosting:
            await self._reconcile(full_listing=False, topics=hosting)
        for name, partitions in appeared.items():
            if not await self._host_appeared(name, partitions):
                await self._reconcile(full_listing=False, topics={name})
                hosting.add(name)
        await self._reconcile_roles(
            {
                name: partitions - appeared.get(name, frozenset())
                for name, partitions in changed.items()
                if name not in hosting
            }
        )

    def _partition_count(self, name: str) -> int | None:
        """Topic `name`'s partition count, as etcd says; None: no such topic."""
        topic = self.view.topics.get(name)
        return None if topic is None else len(topic.replicas)

    def _hosts_as_listed(self, name: str) -> bool:
        """Whether topic `name` is hosted here as its etcd record says (its
        last reconcile succeeded, for this incarnation of the topic), so that
        new partition states may be added to it one by one."""
        topic = self.view.topics.get(name)
        return (
            topic is not None
            and name in self._followed
            and name not in self._hosting_failed
            and self._local_ids.get(name, topic.topic_id) == topic.topic_id
        )

    async def _host_appeared(self, name: str, partitions: frozenset[int]) -> bool:
        """Host the partitions of topic `name` whose states just appeared and
        of which this broker is a replica, and apply their roles; the roles
        of the partitions already hosted are left alone (`_reconcile_roles`
        applies the changed ones). False when hosting failed: the caller
        reconciles the whole topic, which reports it."""
        topic = self.view.topics[name]
        me = self.broker.broker_id
        new = sorted(p for p in partitions if p < len(topic.replicas) and me in topic.replicas[p])
        if not new:
            return True
        hosted = self.manager.logs.hosted_partitions(name)
        try:
            await self.manager.logs.host_partitions_off_loop(
                TopicSpec(name, len(topic.replicas), dict(topic.configs), topic.topic_id),
                [*hosted, *new],
                self._leader_epochs(topic, new),
            )
        except Exception:
            # Not swallowed: the caller's whole-topic reconcile tries again
            # and logs and records the failure (`_hosting_failed`).
            return False
        followed = self._followed[name]
        for p in new:
            self._apply_role(topic, p, followed)
            await self._slices.pause()
        self._apply_replication()
        if self._local_ids.get(name) != topic.topic_id:
            self._local_ids[name] = topic.topic_id
            self._save_meta()
        return True

    def _states_present(self, changed: dict[str, set[int]]) -> dict[str, frozenset[int]]:
        """Of each topic's `changed` partitions, those with a state (of this
        incarnation of the topic) in the view."""
        present: dict[str, frozenset[int]] = {}
        for name, partitions in changed.items():
            topic = self.view.topics.get(name)
            present[name] = frozenset(
                p for p in partitions if topic is not None and self.view.state(topic, p) is not None
            )
        return present

    # ------------------------------------------------------------ reconcile

    async def _reconcile(
        self, full_listing: bool, topics: set[str] | None = None, *, retry: bool = False
    ) -> None:
        """Make the PartitionManager host the partitions this broker is a
        replica of, each in the role etcd gives it; follow the leaders.
        `topics`: only these changed (None: any may have). `retry`: the
        timer's retry of failed hostings (`_retry_hostings`), not a change
        in etcd. Under `_hosting`."""
        ids_changed = False
        names = self.view.topics if topics is None else topics & self.view.topics.keys()
        for name in list(names):
            ids_changed |= await self._reconcile_topic(name, self.view.topics[name], retry)
        for name in self.manager.logs.topic_names():
            if name not in self.view.topics:
                self.manager.logs.drop_topic(name, delete_data=True)
                # Also logs closed earlier (their state key went first).
                self.manager.logs.delete_local_logs(
                    name, self.manager.logs.local_topics().get(name, [])
                )
                if self._local_ids.pop(name, None) is not None:
                    ids_changed = True
        for name in sorted(self._hosting_failed.keys() - self.view.topics.keys()):
            # Never hosted here, so unknown to the manager, yet partly opened.
            # Deleted: no longer retried, nor listed offline.
            self._hosting_failure_ended(name)
            self.manager.logs.delete_local_logs(
                name, self.manager.logs.local_topics().get(name, [])
            )
        for name in [n for n in self._followed if n not in self.view.topics]:
            del self._followed[name]
        for name in [n for n in self._throttled if n not in self.view.topics]:
            del self._throttled[name]
        self._apply_replication()
        # Once the topics and the states are listed; the cluster id may come
        # later (the registration loop fetches it), so retried on every
        # reconcile until it is known: a check skipped at the first listing
        # never came back. Run with the topics listed but not the states, it
        # took every moved replica for one being created and never looked
        # again: the log stayed on disk for good.
        self._topics_listed |= full_listing
        if self._topics_listed and self._states_listed and not self._strays_checked:
            ids_changed |= self._delete_strays()
        if ids_changed:
            self._save_meta()
        if self._starting and self._topics_listed and self._states_listed:
            # Every assigned log is hosted (or failed, and listed offline),
            # so the torn ones are known: electable from now on.
            self._starting = False
            self._offline_changed.set()

    async def _reconcile_topic(self, name: str, topic: KnownTopic, retry: bool = False) -> bool:
        """Host, in their roles, the partitions of one topic this broker is a
        replica of; returns whether the topic ids kept in cluster.json changed.
        `retry`: see `_reconcile`."""
        me = self.broker.broker_id
        ids_changed = False
        led = [
            p
            for p in range(len(topic.replicas))
            if self.view.state(topic, p) is not None and me in topic.replicas[p]
        ]
        known = self._local_ids.get(name)
        if known is not None and known != topic.topic_id:
            # Re-created under the same name: the old records must go.
            log.info("topic %s was re-created (id %s, was %s)", name, topic.topic_id, known)
            self.manager.logs.drop_topic(name, delete_data=True)
            self.manager.logs.delete_local_logs(
                name, self.manager.logs.local_topics().get(name, [])
            )
            del self._local_ids[name]
            ids_changed = True
        self._followed.pop(name, None)
        self._throttled.pop(name, None)
        try:
            self._drop_unassigned(name, topic, led)
            await self.manager.logs.host_partitions_off_loop(
                TopicSpec(name, len(topic.replicas), dict(topic.configs), topic.topic_id),
                led,
                self._leader_epochs(topic, led),
            )
        except TidelogError as exc:
            # Refused (past max.partitions) or failed (out of descriptors):
            # it may have left directories, removed if the topic is deleted.
            retry_s = self._hosting_did_fail(name, led, retry)
            flood.warning(
                "hosting partitions %s of %s failed: %s; retrying in %.0f s",
                led,
                name,
                exc,
                retry_s,
            )
            await self._apply_hosted_roles(name, topic, led)
            return ids_changed
        except Exception:
            retry_s = self._hosting_did_fail(name, led, retry)
            flood.exception(
                "hosting partitions %s of %s failed; retrying in %.0f s", led, name, retry_s
            )
            await self._apply_hosted_roles(name, topic, led)
            return ids_changed
        if self._hosting_failure_ended(name):
            log.info("hosting partitions %s of %s succeeded after failing", led, name)
        await self._apply_roles(name, topic, led)
        if led and self._local_ids.get(name) != topic.topic_id:
            self._local_ids[name] = topic.topic_id
            ids_changed = True
        return ids_changed

    def _drop_unassigned(self, name: str, topic: KnownTopic, replicas: list[int]) -> None:
        """Before hosting topic `name`: close its hosted partitions not among
        `replicas` (those it is to host now), and delete the logs of those a
        reassignment moved away (the partition lives on, without this
        broker), as Kafka deletes them. First, so that a hosting that fails
        drops them too: it left them open, in their last role and followed
        by no fetcher, until a retry succeeded, and holding their room
        (max.partitions, descriptors), which that retry then never found."""
        hosted = self.manager.logs.hosted_partitions(name)
        wanted = set(replicas)  # thousands of partitions: no list lookups
        kept = [p for p in hosted if p in wanted]
        if kept == hosted:
            return
        me = self.broker.broker_id
        moved = [
            p
            for p in hosted
            if p < len(topic.replicas)
            and me not in topic.replicas[p]
            and self.view.state(topic, p) is not None
        ]
        try:
            # Exactly the kept ones, under the spec they are hosted with:
            # only the others close (their roles go with them, also when a
            # close fails: it raises once all are closed), nothing opens.
            self.manager.logs.host_partitions(self.manager.logs.topic(name).spec, kept)
        finally:
            # Closed either way, so no longer hosted: deleted now, as no
            # later call finds them hosted to delete them.
            if moved:
                log.info(
                    "%s partitions %s moved to other brokers: deleting their logs", name, moved
                )
                self.manager.logs.delete_local_logs(name, moved)

    async def _apply_roles(self, name: str, topic: KnownTopic, partitions: list[int]) -> None:
        """Apply the roles of `partitions` of topic `name`, all hosted here:
        the followed ones become the topic's `_followed` entry, and the
        topic's throttled reassignments its `_throttled` entry (the caller
        applies the replication)."""
        followed = self._followed[name] = {}
        for p in partitions:
            self._apply_role(topic, p, followed)
            await self._slices.pause()
        throttled = {
            p: reassignment
            for p, reassignment in topic.reassignments.items()
            if reassignment.throttle_bytes_per_s > 0 and reassignment.adding
        }
        if throttled:
            self._throttled[name] = throttled

    async def _apply_hosted_roles(self, name: str, topic: KnownTopic, replicas: list[int]) -> None:
        """After hosting topic `name` failed: apply the roles of those of
        `replicas` (the partitions this broker is a replica of) still hosted
        here, as a success would. A topic already partly hosted (partitions
        added, whose opening failed) keeps following its leaders and takes
        up leaderships meanwhile: before, its hosted followers stopped
        fetching (and fell out of the ISR) and its role changes waited for a
        retry that succeeded, up to HOSTING_RETRY_MAX_S without a serving
        leader. The unhosted ones get no role (the retry applies theirs).
        Throttles: as a success keeps them; those of unhosted partitions
        throttle nothing, as nothing here serves or fetches them."""
        hosted = set(self.manager.logs.hosted_partitions(name))
        await self._apply_roles(name, topic, [p for p in replicas if p in hosted])

    def _hosting_did_fail(self, name: str, replicas: list[int], retry: bool) -> float:
        """Record that hosting topic `name`, whose partitions `replicas` this
        broker is a replica of, failed; returns the wait before its retry.
        `retry`: the attempt was the timer's retry, so the wait doubles; any
        other (a change of the topic in etcd, a new listing or registration)
        brought new information and starts the waits over. Before, a change
        doubled it too: a partition added to a topic failing for a while was
        tried again up to 30 s later, however soon the shortage ended.

        Those of `replicas` not hosted are listed offline in the registration
        until a retry hosts them or the topic goes, as Kafka lists the
        replicas in a failed log directory: a replica hosting nothing of a
        partition cannot lead it or keep up with its leader, and, not listed,
        the controller could elect it or keep it in the ISR (a partition
        without a leader till the topic's next change). Listed, it is neither
        elected nor, once its leader's watch has the listing, let back into
        the ISR. Whatever the cause: a refusal past max.partitions is retried
        too (harmless: refused before any log opens), as room may free up
        (a topic deleted, a replica moved away) without this topic changing."""
        previous = self._hosting_failed.get(name)
        delay = (
            min(previous.delay_s * 2, HOSTING_RETRY_MAX_S)
            if retry and previous is not None
            else HOSTING_RETRY_INITIAL_S
        )
        hosted = set(self.manager.logs.hosted_partitions(name))
        unhosted = frozenset(p for p in replicas if p not in hosted)
        self._hosting_failed[name] = _FailedHosting(
            unhosted, delay, asyncio.get_running_loop().time() + delay
        )
        if previous is None or previous.unhosted != unhosted:
            self._offline_changed.set()
        self._hosting_failures_changed.set()
        return delay

    def _hosting_failure_ended(self, name: str) -> bool:
        """Topic `name` was hosted, or deleted: no longer retried, nor its
        partitions listed offline for it. False if its hosting had not failed."""
        failed = self._hosting_failed.pop(name, None)
        if failed is None:
            return False
        if failed.unhosted:
            self._offline_changed.set()
        self._hosting_failures_changed.set()
        return True

    async def _retry_hostings(self) -> None:
        """Reconcile again, when due, the topics whose hosting failed: the
        reconcile of a topic change, so a success applies the roles and
        replication as any does, and a deleted topic is no longer retried."""
        loop = asyncio.get_running_loop()
        while True:
            self._hosting_failures_changed.clear()
            now = loop.time()
            if any(failed.due <= now for failed in self._hosting_failed.values()):
                try:
                    async with self._hosting:
                        # Judged again under the lock: a watch's reconcile
                        # may have hosted, failed again or deleted them.
                        now = loop.time()
                        due = {n for n, f in self._hosting_failed.items() if f.due <= now}
                        await self._reconcile(full_listing=False, topics=due, retry=True)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    flood.exception("retrying failed hostings failed")
                    await asyncio.sleep(HOSTING_RETRY_INITIAL_S)
                continue
            next_due = min((f.due for f in self._hosting_failed.values()), default=None)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if next_due is None else next_due - now):
                    await self._hosting_failures_changed.wait()

    async def _reconcile_roles(self, changed: dict[str, set[int]]) -> None:
        """New leaders, epochs or ISRs of partitions whose hosting is as it
        was: applied to those partitions alone."""
        applied = False
        me = self.broker.broker_id
        for name, partitions in changed.items():
            topic = self.view.topics.get(name)
            followed = self._followed.get(name)
            if topic is None or followed is None:
                continue  # not hosted here
            # A topic whose hosting failed has its hosted partitions' roles
            # applied (`_apply_hosted_roles`), the others none: set_role
            # would find no log. The retry applies theirs.
            hosted = (
                set(self.manager.logs.hosted_partitions(name))
                if name in self._hosting_failed
                else None
            )
            for p in partitions:
                if (
                    p < len(topic.replicas)
                    and me in topic.replicas[p]
                    and (hosted is None or p in hosted)
                ):
                    followed.pop(p, None)
                    self._apply_role(topic, p, followed)
                    applied = True
                    await self._slices.pause()
        if applied:
            self._apply_replication()

    def _role(self, state: KnownState) -> Role:
        """This broker's role in a partition in `state`."""
        if state.leader == self.broker.broker_id:
            # See registration_revision.
            leads = state.mod_revision > self.registration_revision > 0
            return Role.LEADER if leads else Role.NONE
        return Role.FOLLOWER if state.leader >= 0 else Role.NONE

    def _leader_epochs(self, topic: KnownTopic, partitions: Iterable[int]) -> dict[int, int]:
        """Of `partitions`, those this broker is to lead, with their leader
        epoch: recorded in the epoch history of those newly hosted while
        their logs open off the loop (two fsyncs each)."""
        epochs: dict[int, int] = {}
        for p in partitions:
            state = self.view.state(topic, p)
            if state is not None and self._role(state) is Role.LEADER:
                epochs[p] = state.leader_epoch
        return epochs

    def _apply_role(
        self, topic: KnownTopic, partition: int, followed: dict[int, tuple[int, int]]
    ) -> None:
        """Apply one hosted partition's state; a followed partition goes into
        `followed` (partition -> (leader, leader epoch))."""
        state = self.view.state(topic, partition)
        if state is None:
            return
        role = self._role(state)
        if role is Role.FOLLOWER:
            followed[partition] = (state.leader, state.leader_epoch)
        if self.manager.logs.is_torn(topic.name, partition):
            # Its log may have grown since the registration gave its figures
            # (it followed, or led): the state changed (maybe leaderless now,
            # and it no longer fetches), so publish what it holds now, which
            # the controller compares when every ISR member is torn. Per
            # state change, not per append: a registration write wakes every
            # watcher of brokers/. Unchanged figures write nothing.
            self._offline_changed.set()
        try:
            self.manager.replicas.set_role(
                topic.name,
                partition,
                role=role,
                leader_id=state.leader,
                leader_epoch=state.leader_epoch,
                replicas=topic.replicas[partition],
                isr=state.isr,
                revision=state.mod_revision,
            )
        except StorageError as exc:
            # Its log is offline (a storage failure, or it could not be
            # opened): it cannot lead. The registration lists it, so the
            # controller moves leadership off it, and the new state applies.
            flood.warning(
                "%s-%d cannot take its role %s: %s", topic.name, partition, role.value, exc
            )
        except Exception:
            flood.exception("applying the state of %s-%d failed", topic.name, partition)

    def _apply_replication(self) -> None:
        """Point the replica fetchers at the leaders of every followed
        partition, and configure the reassignments' replication throttle."""
        followed: dict[int, dict[tuple[str, int], int]] = {}
        for name, partitions in self._followed.items():
            for p, (leader, epoch) in partitions.items():
                followed.setdefault(leader, {})[(name, p)] = epoch
        throttled: dict[tuple[str, int], frozenset[int]] = {}
        rates: list[int] = []
        for name, reassignments in self._throttled.items():
            for p, reassignment in reassignments.items():
                throttled[(name, p)] = frozenset(reassignment.adding)
                rates.append(reassignment.throttle_bytes_per_s)
        self.fetchers.assign(followed)
        self.manager.replicas.throttle.configure(throttled, min(rates, default=0))

    def _delete_strays(self) -> bool:
        """At the first listing of topics and states: delete logs of topics
        deleted while we were down, and of replicas reassigned to other
        brokers meanwhile."""
        if not self.cluster_id or self._local_cluster_id != self.cluster_id:
            return False  # not sure this data dir is ours: keep everything
        self._strays_checked = True
        changed = False
        me = self.broker.broker_id
        for name, partitions in self.manager.logs.local_topics().items():
            topic = self.view.topics.get(name)
            if topic is None:
                self.manager.logs.delete_local_logs(name, partitions)
                changed |= self._local_ids.pop(name, None) is not None
                continue
            # Replicas moved away by a reassignment while we were down.
            moved = [
                p
                for p in partitions
                if p < len(topic.replicas)
                and me not in topic.replicas[p]
                and self.view.state(topic, p) is not None
            ]
            if moved and self._local_ids.get(name) == topic.topic_id:
                log.info("%s partitions %s moved away while this broker was down", name, moved)
                self.manager.logs.delete_local_logs(name, moved)
        return changed

    # ------------------------------------------------------------ replication

    async def _settle_isr_write(
        self,
        key: bytes,
        base: aetcd.rtypes.Get,
        replication: PartitionReplication,
        isr: list[int],
    ) -> bool:
        """Settle an ISR write of unknown outcome, made against `base` (the
        state key as read before it): True when it may be in etcd, False
        when it surely is not. Reading the key back would not do: etcd may
        still apply the write after the read. Instead, put the same value
        again fenced by the same revision: if that lands, the write never
        can (its fence is gone); if it is refused, the state moved past
        `base` and the watch, bringing it, ends the proposal (set_role).
        Retried while the proposal stands: till then the HW waits for the
        replicas it adds. The same value in a newer state would hide from
        the controller that a member registered again since (see write_isr):
        then it is not put, and the controller's removal of that member, a
        newer state, ends the proposal. The joining replicas' registrations,
        which write_isr also compares, are not: the same value again adds
        no one, and an offline replica is told by its registration alone,
        not by the state's revision; were the put refused for them, a write
        that they refused would leave the proposal standing with nothing to
        end it, the HW waiting for a replica that is not in the ISR."""
        tx = self.client.transactions
        members = [r for r in PartitionState.decode(base.value).isr if r != self.broker.broker_id]
        while replication.proposed_isr is isr:
            try:
                fenced, _ = await self.client.transaction(
                    compare=[
                        tx.mod(key) == base.mod_revision,
                        tx.value(key) == base.value,
                        *(tx.create(self.keys.broker(r)) < base.mod_revision for r in members),
                    ],
                    success=[tx.put(key, base.value)],
                    failure=[],
                )
            except Exception as exc:
                flood.warning("settling the ISR write of %r failed (%s); retrying", key, exc)
                await asyncio.sleep(RETRY_DELAY_S)
                continue
            return not fenced
        return False  # a newer state ended it: its outcome no longer matters

    def lease_valid(self) -> bool:
        """Registered, and the session lease surely alive: may lead."""
        session = self._session
        return session is not None and self.registered.is_set() and session.valid()

    async def write_isr(self, replication: PartitionReplication, isr: list[int]) -> bool:
        """As leader: write a new ISR, fenced by the state key's mod revision
        and value (leader, leader epoch) as they were when the change was
        proposed (the state set_role had applied then; a state the watch
        brought since refuses the write). True when written, or perhaps
        written (the transaction failed after the state moved on): the
        proposal then stands until the watch brings a state newer than the
        one written against (replica_state). False only when surely not
        written."""
        topic = self.view.topics.get(replication.topic)
        known = None if topic is None else self.view.state(topic, replication.partition)
        registration = self.registration_revision
        if (
            known is None
            or known.leader != self.broker.broker_id
            or known.leader_epoch != replication.leader_epoch
            # Only against the state the proposal was computed from: the
            # view may be ahead of what set_role applied (the watch awaits
            # between the two), and a proposal from an older ISR would undo
            # what changed since, such as the controller removing a replica
            # that restarted with a torn log (replica_state's module doc).
            or known.mod_revision != replication.proposal_base_revision
            or not self.lease_valid()
        ):
            return False
        key = self.keys.partition_state(replication.topic, replication.partition)
        current = await self.client.get(key)
        if current is None or current.mod_revision != known.mod_revision:
            return False  # the watch is about to bring a newer state
        current_state = PartitionState.decode(current.value)
        if (
            current_state.leader != self.broker.broker_id
            or current_state.leader_epoch != replication.leader_epoch
        ):
            return False
        # Joining replicas must still hold the registration their fetches
        # were bound to, and one that does not list their log of this
        # partition offline: judged on the view, and compared in etcd (its
        # create and mod revisions), in case our watch is behind. The view
        # is judged here, not only when the change was proposed: the watch
        # may have brought the listing since.
        joining = [r for r in isr if r not in known.isr and r != self.broker.broker_id]
        registrations: dict[int, tuple[int, int]] = {}
        for r in joining:
            progress = replication.followers.get(r)
            value_revision = self.view.registration_mod_revision(r)
            if (
                progress is None
                or value_revision is None
                or progress.registration != self.view.registration_of(r)
                or self.view.lists_offline(r, replication.topic, replication.partition)
            ):
                return False
            registrations[r] = (progress.registration, value_revision)
        staying = [r for r in isr if r in known.isr and r != self.broker.broker_id]
        try:
            min_isr = self.manager.logs.topic(replication.topic).config.min_insync_replicas
        except TidelogError:
            return False  # the topic is going: nothing to write
        written = dataclasses.replace(
            current_state,
            isr=tuple(isr),
            version=current_state.version + 1,
            # Members leaving an ISR below min.insync.replicas stay eligible
            # to lead (PartitionState.elr); reaching it again clears them.
            elr=next_elr(current_state.isr, isr, current_state.elr, min_isr, replication.replicas),
        )
        if replication.proposed_isr is not isr:
            # A newer state ended the proposal meanwhile; the next one, even
            # with an equal ISR, is its own writer's to write.
            return False
        tx = self.client.transactions
        try:
            ok, _ = await self.client.transaction(
                compare=[
                    tx.mod(key) == known.mod_revision,
                    tx.value(key) == current.value,
                    # We still hold the registration we lead under: no write
                    # lands after our lease is revoked or expired.
                    tx.create(self.keys.broker(self.broker.broker_id)) == registration,
                    *(
                        compare
                        for r, (created, written_at) in registrations.items()
                        for compare in (
                            tx.create(self.keys.broker(r)) == created,
                            # Rewritten in place since the view had it (it
                            # may list this replica offline now): the watch
                            # brings the rewrite, and the next fetch judges
                            # on it.
                            tx.mod(self.keys.broker(r)) == written_at,
                        )
                    ),
                    # A member that registered again since the state (it
                    # restarted, maybe with a torn log) is the controller's
                    # to remove (leader_election): written in a newer state,
                    # it would no longer look restarted, and could be elected.
                    *(tx.create(self.keys.broker(r)) < known.mod_revision for r in staying),
                ],
                success=[tx.put(key, written.encode())],
                failure=[],
            )
        except Exception:
            # Sent, and perhaps applied (a deadline or a connection lost
            # after etcd committed it, or to be applied yet): ending the
            # proposal now could let the HW pass a replica that etcd's ISR
            # names.
            flood.exception(
                "%s-%d: writing ISR %s failed; settling whether it was written",
                replication.topic,
                replication.partition,
                isr,
            )
            ok = await self._settle_isr_write(key, current, replication, isr)
        log.info(
            "%s-%d: ISR %s -> %s%s %s",
            replication.topic,
            replication.partition,
            known.isr,
            isr,
            f" (elr {list(written.elr)})" if written.elr or current_state.elr else "",
            "written"
            if ok
            else "not written (the state, or a registration it depends on, changed)",
        )
        return bool(ok)
