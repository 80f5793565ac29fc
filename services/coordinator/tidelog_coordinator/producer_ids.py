"""Producer ids for idempotent producers, allocated from a counter in etcd.

`InitProducerId` without a producer key takes the next id from
`<prefix>/producer_ids/next` (a transaction that compares the counter's mod
revision, so two coordinator replicas never hand out the same id) with epoch
0. With a producer key, the id recorded under
`<prefix>/producer_ids/keys/<key>` is returned with its epoch one higher,
written by a transaction that compares that key's revision: of two instances
starting with the same key, each gets its own epoch, and brokers reject the
older one's batches (INVALID_PRODUCER_EPOCH). When the epoch would pass
32767 (an int16 in the batch header) the key moves to a new id at epoch 0.

Ids are never reused; an id costs one etcd write, and producers ask once per
start, so the counter is not allocated in blocks.
"""

from __future__ import annotations

import json

import aetcd
from tidelog.errors import CoordinatorNotAvailableError, InvalidRequestError
from tidelog_server.etcd.keys import Keys

#: The largest epoch a batch header can carry (int16).
MAX_EPOCH = 32_767
#: Transactions tried before reporting contention (each failure means another
#: replica allocated meanwhile; the next attempt re-reads).
ATTEMPTS = 20
#: Producer keys are names, not payloads.
MAX_PRODUCER_KEY_CHARS = 255


class ProducerIdAllocator:
    """Allocates producer ids and epochs in etcd. Safe for concurrent use."""

    def __init__(self, client: aetcd.Client, keys: Keys) -> None:
        self._client = client
        self._keys = keys

    async def init_producer_id(self, producer_key: str = "") -> tuple[int, int]:
        """(producer id, epoch) for a producer starting (see module doc)."""
        if len(producer_key) > MAX_PRODUCER_KEY_CHARS:
            raise InvalidRequestError(
                f"producer_key is {len(producer_key)} characters; at most "
                f"{MAX_PRODUCER_KEY_CHARS} are allowed"
            )
        tx = self._client.transactions
        counter_key = self._keys.producer_id_counter
        for _ in range(ATTEMPTS):
            compare = []
            success = []
            if producer_key:
                key = self._keys.producer_key(producer_key)
                got = await self._client.get(key)
                if got is not None:
                    record = json.loads(got.value)
                    if int(record["epoch"]) < MAX_EPOCH:
                        producer_id, epoch = int(record["producer_id"]), int(record["epoch"]) + 1
                        ok, _ = await self._client.transaction(
                            compare=[tx.mod(key) == got.mod_revision],
                            success=[tx.put(key, _record(producer_id, epoch))],
                            failure=[],
                        )
                        if ok:
                            return producer_id, epoch
                        continue
                compare.append(
                    tx.create(key) == 0 if got is None else tx.mod(key) == got.mod_revision
                )
            counter = await self._client.get(counter_key)
            producer_id = 0 if counter is None else int(counter.value)
            compare.append(
                tx.create(counter_key) == 0
                if counter is None
                else tx.mod(counter_key) == counter.mod_revision
            )
            success.append(tx.put(counter_key, str(producer_id + 1).encode()))
            if producer_key:
                success.append(tx.put(key, _record(producer_id, 0)))
            ok, _ = await self._client.transaction(compare=compare, success=success, failure=[])
            if ok:
                return producer_id, 0
        raise CoordinatorNotAvailableError(
            f"could not allocate a producer id in {ATTEMPTS} attempts (contention): retry"
        )


def _record(producer_id: int, epoch: int) -> bytes:
    return json.dumps({"producer_id": producer_id, "epoch": epoch}, sort_keys=True).encode()
