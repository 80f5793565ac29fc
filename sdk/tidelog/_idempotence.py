"""The idempotent producer's identity and numbering (used by the sender).

`ProducerIdentity` owns, for one producer:

- its producer id and epoch, asked of the cluster with `InitProducerId`
  (any bootstrap server answers: a coordinator, a broker forwarding to one,
  or a standalone broker allocating from its own counter), lazily, before
  the first batch is sent, and again with backoff while that fails;
- the next sequence number of each partition: a batch gets its base
  sequence when first drained (so a batch that expires unsent leaves no
  gap) and keeps it, with its encoded bytes, across retries;
- what to do when numbering cannot continue: a numbered batch that fails
  for good (the broker may or may not have written it) leaves a gap that
  every later batch of that partition would hit, so the producer takes a
  new producer id once nothing numbered is in flight (Kafka's reset of the
  producer id), and numbering restarts at 0; an INVALID_PRODUCER_EPOCH
  answer means another instance with the same producer_key took over, and
  the producer is *fenced*: every batch fails from then on.

Not thread-safe: the sender's event loop calls it.
"""

from __future__ import annotations

import logging
import time

import grpc
import grpc.aio

from tidelog._accumulator import ProducerBatch
from tidelog._connection import Cluster, call_error
from tidelog.config import ProducerConfig
from tidelog.errors import (
    BrokerNotAvailableError,
    InvalidProducerEpochError,
    TidelogError,
)
from tidelog.types import TopicPartition
from tidelog.v1 import cluster_pb2

log = logging.getLogger("tidelog.producer")

#: Largest sequence number; the next one is 0 (as in Kafka).
SEQUENCE_MAX = 2**31 - 1


def increment_sequence(sequence: int, increment: int) -> int:
    """`sequence + increment`, wrapping past SEQUENCE_MAX to 0."""
    if sequence > SEQUENCE_MAX - increment:
        return increment - (SEQUENCE_MAX - sequence) - 1
    return sequence + increment


class ProducerIdentity:
    """Producer id, epoch and per-partition sequences (see module doc)."""

    def __init__(self, cluster: Cluster, config: ProducerConfig) -> None:
        self._cluster = cluster
        self._config = config
        #: False: the producer is not idempotent (configured so, or the
        #: servers do not serve InitProducerId and idempotence was a default).
        self.enabled = config.idempotent
        self._explicit = config.enable_idempotence is True
        self.producer_id = -1
        self.epoch = -1
        self._next_sequence: dict[TopicPartition, int] = {}
        #: A numbered batch failed for good: take a new producer id once
        #: nothing numbered is unresolved.
        self.reset_wanted = False
        #: Set when the producer can send nothing more (fenced, or idempotence
        #: required but not served): every batch fails with it.
        self.fatal: TidelogError | None = None
        #: Why the last InitProducerId failed (named when batches expire).
        self.last_error: TidelogError | None = None
        #: monotonic time before which InitProducerId is not tried again.
        self.retry_at = 0.0
        self._attempts = 0

    @property
    def can_number(self) -> bool:
        """New batches may be drained: they can get sequences now (or the
        producer is not idempotent and they need none)."""
        if not self.enabled or self.fatal is not None:
            return True
        return self.producer_id >= 0 and not self.reset_wanted

    def needs_id(self) -> bool:
        return self.enabled and self.fatal is None and (self.producer_id < 0 or self.reset_wanted)

    async def init(self, backoff_s: float, backoff_max_s: float) -> None:
        """Ask for a producer id (InitProducerId on each known server in turn).
        On failure, sets `retry_at` (or `fatal`, or falls back to not being
        idempotent when idempotence was only a default and is not served)."""
        request = cluster_pb2.InitProducerIdRequest(producer_key=self._config.producer_key or "")
        timeout_s = self._config.request_timeout_ms / 1000
        error: TidelogError | None = None
        for address in self._cluster.any_address():
            try:
                reply = await self._cluster.cluster_stub(address).InitProducerId(
                    request, timeout=timeout_s
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self._not_served(address)
                    return
                error = call_error(exc, address)
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    continue
                break
            except TidelogError as exc:  # the client is closed
                error = exc
                break
            self.producer_id = reply.producer_id
            self.epoch = reply.producer_epoch
            self._next_sequence.clear()
            self.reset_wanted = False
            self.last_error = None
            self._attempts = 0
            log.info("producer id %d, epoch %d (from %s)", self.producer_id, self.epoch, address)
            return
        error = error or BrokerNotAvailableError("no server to ask for a producer id")
        self.last_error = error
        if not error.retriable:
            self.fatal = type(error)(f"the producer cannot get a producer id: {error.message}")
            return
        delay = min(backoff_s * 2**self._attempts, backoff_max_s)
        self._attempts += 1
        self.retry_at = time.monotonic() + delay
        log.warning("InitProducerId failed (%s); retrying in %.2f s", error, delay)

    def _not_served(self, address: str) -> None:
        message = (
            f"{address} does not serve InitProducerId, which idempotence needs (a server "
            "older than idempotent producers?)"
        )
        if self._explicit:
            self.fatal = BrokerNotAvailableError(
                message + "; set enable_idempotence=False to send without it"
            )
        else:
            log.warning("%s: sending without idempotence", message)
            self.enabled = False

    def number(self, batch: ProducerBatch) -> None:
        """Give a batch drained for the first time its producer fields."""
        tp = batch.tp
        sequence = self._next_sequence.get(tp, 0)
        batch.producer_id = self.producer_id
        batch.producer_epoch = self.epoch
        batch.base_sequence = sequence
        self._next_sequence[tp] = increment_sequence(sequence, batch.record_count())

    def failed_for_good(self, batch: ProducerBatch) -> None:
        """A batch failed and will not be retried: if it was numbered by the
        current id, its sequence may be a gap, so a new id is wanted."""
        if (
            self.enabled
            and self.fatal is None
            and batch.base_sequence >= 0
            and batch.producer_id == self.producer_id
            and batch.producer_epoch == self.epoch
        ):
            if not self.reset_wanted:
                log.warning(
                    "%s-%d: a numbered batch failed; taking a new producer id",
                    batch.topic,
                    batch.partition,
                )
            self.reset_wanted = True

    def fence(self, error: TidelogError) -> TidelogError:
        """INVALID_PRODUCER_EPOCH: another instance took over; returns the
        error every batch fails with from now on."""
        if self.fatal is None:
            key = self._config.producer_key
            self.fatal = InvalidProducerEpochError(
                f"this producer (id {self.producer_id}, epoch {self.epoch}"
                + (f", producer_key {key!r}" if key else "")
                + ") is fenced: a newer producer took over its id. Close it; nothing more "
                f"will be sent. Broker said: {error.message}"
            )
        return self.fatal
