"""etcd primitives in the spirit of etcd's client/v3/concurrency package.

- `connect`: an aetcd client with the channel options the coordinator needs;
- `Session`: a lease kept alive every TTL/3, with a `lost` event;
- `Election`: candidates ordered by create revision, each watching only its
  predecessor; the leader's writes compare its key's create revision;
- `PrefixWatcher`: a listing then every change under a prefix, resumed from
  the last seen revision after a lost connection, re-listed after compaction.
"""

from tidelog_coordinator.etcd.client import EtcdUnavailableError, connect, is_unavailable
from tidelog_coordinator.etcd.election import Election
from tidelog_coordinator.etcd.session import Session
from tidelog_coordinator.etcd.watch import Change, PrefixWatcher, WatchBatch

__all__ = [
    "Change",
    "Election",
    "EtcdUnavailableError",
    "PrefixWatcher",
    "Session",
    "WatchBatch",
    "connect",
    "is_unavailable",
]
