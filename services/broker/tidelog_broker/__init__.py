"""The Tidelog broker: the data plane.

Layers, each in its own module, calling downward only:
- `server` runs the process: gRPC server, health, reflection, shutdown;
- `log_servicer`, `admin_servicer`, `fetch_session` validate requests and
  map errors (`error_mapping`); `fetch_limits` bounds what Fetch streams
  make the broker hold;
- `partition_manager` does the work against the partitions it hosts;
- `storage` persists: segments, indexes, recovery (no gRPC, no etcd);
- `topic_store` remembers topics while the broker runs alone;
- `resources` derives the partitions a broker can host from its open-file
  limit.
"""
