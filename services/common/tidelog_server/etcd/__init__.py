"""etcd primitives shared by the services (a client never needs etcd).

The coordinator and the broker (in cluster mode) both hold sessions, follow
prefixes and spell keys the same way, and services never import each other,
so the primitives live here, in the server core that both depend on.
In the spirit of etcd's client/v3/concurrency package:

- `connect`: an `EtcdClient` (aetcd with the channel options the services
  need) over one member or several, failing over between them
  (`parse_endpoints` reads an `--etcd host:port[,host:port...]` value);
  `is_unavailable`: whether a failure means "etcd unreachable, retry";
- `Keys` (in `keys`): the etcd key layout of a cluster, with one parser per
  kind of key; `records`: typed values stored under those keys;
- `ensure_cluster_id` (in `cluster_id`): the cluster id, created once;
- `Session`: a lease kept alive every TTL/3, with a `lost` event;
- `Election`: candidates ordered by create revision, each watching only its
  predecessor; the leader's writes compare its key's create revision;
- `PrefixWatcher`: a listing then every change under a prefix, resumed from
  the last seen revision after a lost connection, re-listed after compaction.
"""

from tidelog_server.etcd.client import EtcdClient, connect, is_unavailable, parse_endpoints
from tidelog_server.etcd.election import Election, ElectionKeyLostError
from tidelog_server.etcd.session import Session
from tidelog_server.etcd.watch import Change, PrefixWatcher, WatchBatch

__all__ = [
    "Change",
    "Election",
    "ElectionKeyLostError",
    "EtcdClient",
    "PrefixWatcher",
    "Session",
    "WatchBatch",
    "connect",
    "is_unavailable",
    "parse_endpoints",
]
