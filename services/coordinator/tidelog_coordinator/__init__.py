"""Tidelog's coordinator: the control plane on etcd.

Owns cluster metadata (brokers, topics, partition placement), the controller
role (one replica at a time, by etcd election), consumer groups (server-side
assignment pushed down heartbeat streams) and committed offsets. Holds no
durable state of its own: everything durable is in etcd (ARCHITECTURE
invariant 7), so any number of replicas can run and any of them serves
Admin and Group requests.
"""
