"""The Tidelog broker: the data plane.

Layers, each in its own module, calling downward only:
- `server` runs the process: gRPC server, health, reflection, shutdown;
- `log_servicer`, `admin_servicer`, `fetch_session` validate requests and
  map errors (`error_mapping`); `fetch_limits` bounds what Fetch streams
  make the broker hold;
- `partition_manager` serves produce, fetch and offset requests over
  `log_manager` (topics, their logs, configs, flush/retention/cleaner loops)
  and `replica_manager` (cluster mode: roles, ISR, high watermarks, follower
  fetching; the rules in `replica_state`); `replica_servicer` and
  `replica_fetcher` are the two ends of replication;
- cluster mode: `cluster_link` registers in etcd and keeps `cluster_view`
  (live brokers, coordinators, topics, partition states) up to date;
  `cluster_servicers` answers Metadata and DescribeCluster from it and
  forwards Admin calls and InitProducerId (`coordinator_forwarding`);
- `storage` persists: segments, indexes, recovery (no gRPC, no etcd);
- `topic_store` remembers topics while the broker runs alone;
- `resources` derives the partitions a broker can host from its open-file
  limit.
"""
