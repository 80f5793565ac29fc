"""The cluster id: created once, by whichever service asks first.

The coordinator (DescribeCluster) and every broker (its meta.properties check)
both need it, and either may start first on an empty etcd.
"""

from __future__ import annotations

import uuid

import aetcd

from tidelog_server.etcd.keys import Keys


async def ensure_cluster_id(client: aetcd.Client, keys: Keys) -> str:
    """The cluster's id, created in the same transaction that finds it absent.

    The put happens only while the key has never been created (create
    revision 0), so of racing callers one writes and the others read its id.
    """
    tx = client.transactions
    new_id = uuid.uuid4().hex
    ok, responses = await client.transaction(
        compare=[tx.create(keys.cluster_id) == 0],
        success=[tx.put(keys.cluster_id, new_id.encode())],
        failure=[tx.get(keys.cluster_id)],
    )
    return new_id if ok else responses[0][0][0].decode()
