"""The Tidelog gateway: one stateless gRPC front door for every partition.

It serves the public services (`tidelog.v1.Log`, `Admin`, `Group`,
`Cluster`) and routes each request to where it belongs, so that a client
needs one address and never cares which broker leads what:

- `cluster_view`: what the gateway knows of the cluster, followed from etcd
  (brokers, coordinators, topics, each partition's leader);
- `channels`: the gateway's gRPC channels to brokers and coordinators;
- `limits`: the limits on what clients control (streams, bytes, credit);
- `produce_proxy`: one client Produce stream, split by leader, answered in
  order;
- `fetch_proxy`: one client Fetch stream, merged from the leaders' Fetch
  streams and paced by the client's credit end to end;
- `log_servicer`: `Log` (Produce, Fetch, ListOffsets, Metadata);
- `control_servicers`: `Admin`, `Group`, `Cluster`, forwarded to a
  coordinator replica;
- `records_servicer`: `Records`, the record-level API (records as protobuf
  fields), done with the Python SDK's producer and consumer;
- `server`: the process: health, reflection, drain on SIGTERM.

The gateway keeps no state a client depends on: group membership and
offsets live with the coordinators and etcd, positions with the client.
"""
