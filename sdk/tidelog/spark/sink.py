"""The sink: `df.write.format("tidelog")` and `df.writeStream.format("tidelog")`.

The columns and options are those of Spark's Kafka sink, so a job moves from
Kafka by changing the format name (and the servers option):

- columns: `value` (binary or string, required); optional `key` (binary or
  string), `headers` (array of struct<key: string, value: binary>), `topic`
  (string) and `partition` (int). Other columns are ignored, as Kafka's sink
  does. A row without `topic` goes to the `topic` option; without `partition`
  to the partition of its key (Kafka's murmur2), or round-robin when it has
  no key;
- options: `topic`; the servers as `tidelog.bootstrap.servers` or Kafka's
  `kafka.bootstrap.servers`; producer settings as Kafka's `kafka.<name>`
  pass-through, mapped to the SDK producer's settings (`SETTINGS`);
  `checkpointLocation` (Spark's own).

Everything is checked on the driver when the write or query starts (a bad
column type, a missing topic, an unknown option or a topic that does not
exist fail it with a `SinkOptionError` naming them), not in the tasks.

Exactly once: each task writes through `sink_task.TaskWriter`, an idempotent
producer numbered the same way by every attempt of the task, so a task
retried or a micro-batch replayed by Spark with the same batch id writes
nothing twice (the design, and what it needs, in `tidelog.spark.sink_task`).
The driver's commit only logs what the tasks wrote: by then it is written.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
)

from tidelog._connection import Cluster
from tidelog.config import ProducerConfig
from tidelog.errors import TidelogError, UnknownTopicOrPartitionError
from tidelog.names import validate_topic_name
from tidelog.spark import options as source_options
from tidelog.spark.sink_task import TaskResult, run_task

log = logging.getLogger(__name__)

#: Kafka producer settings (`kafka.<name>`) and the SDK producer's field for each.
SETTINGS = {
    "acks": "acks",
    "batch.size": "batch_size",
    "compression.type": "compression_type",
    "max.request.size": "max_request_size",
    "request.timeout.ms": "request_timeout_ms",
    "delivery.timeout.ms": "delivery_timeout_ms",
    "retry.backoff.ms": "retry_backoff_ms",
    "retry.backoff.max.ms": "retry_backoff_max_ms",
    "metadata.max.age.ms": "metadata_max_age_ms",
    "socket.connection.setup.timeout.ms": "socket_connection_setup_timeout_ms",
    "client.id": "client_id",
}
_INT_SETTINGS = {
    "batch.size",
    "max.request.size",
    "request.timeout.ms",
    "delivery.timeout.ms",
    "retry.backoff.ms",
    "retry.backoff.max.ms",
    "metadata.max.age.ms",
    "socket.connection.setup.timeout.ms",
}
#: Kafka settings accepted with no effect here, and why.
_NO_EFFECT = {
    "linger.ms": "batches are cut by size only, so that a replayed task cuts them alike",
    "enable.idempotence": "the sink is always idempotent",
    "max.in.flight.requests.per.connection": "the sink sends one batch per partition at a time",
}
#: Kafka settings refused, and why (Kafka's sink refuses the serializers too).
_REFUSED = {
    "key.serializer": "keys are written as the bytes of the 'key' column",
    "value.serializer": "values are written as the bytes of the 'value' column",
    "transactional.id": "the sink is exactly once by itself (one producer key per task)",
}
#: Options besides `kafka.*` (checkpointLocation, path and queryName are
#: Spark's own, which it passes to the sink too).
_OPTIONS = (
    "topic",
    source_options.SERVERS,
    "writerId",
    "checkpointLocation",
    "path",
    "queryName",
)
#: Longest writerId: it goes into a producer key (255 characters at most).
WRITER_ID_MAX_CHARS = 160

_BINARY_OR_STRING = (BinaryType, StringType)


class SinkOptionError(ValueError):
    """A column or option of the tidelog sink is missing, unknown or malformed;
    the message names it."""


@dataclass(frozen=True)
class SinkOptions:
    """A sink's checked options (pickled to every task)."""

    topic: str | None
    producer: ProducerConfig
    #: A batch write's name for exactly once across its repetitions (None:
    #: each job is new). `foreachBatch` passes query id and batch id.
    writer_id: str | None = None


def parse_options(options: Mapping[str, str]) -> SinkOptions:
    """Check and parse the sink's options (see the module doc)."""
    settings: dict[str, Any] = {"acks": "all"}
    known = {name.lower() for name in _OPTIONS}
    for name, raw in options.items():
        lowered = name.lower()
        if lowered in known or lowered == source_options.SERVERS_ALIAS:
            continue
        if not lowered.startswith("kafka."):
            raise SinkOptionError(
                f"unknown option {name!r} for the tidelog sink; known options: "
                f"{', '.join(_OPTIONS)}, and Kafka producer settings as 'kafka.<name>' "
                f"({', '.join(sorted([*SETTINGS, *_NO_EFFECT]))})"
            )
        setting = lowered[len("kafka.") :]
        if setting in _REFUSED:
            raise SinkOptionError(f"option {name!r} is not supported: {_REFUSED[setting]}")
        if setting in _NO_EFFECT:
            if setting == "enable.idempotence" and raw.strip().lower() != "true":
                raise SinkOptionError(f"option {name!r} must be true: {_NO_EFFECT[setting]}")
            log.info("option %r has no effect: %s", name, _NO_EFFECT[setting])
            continue
        field = SETTINGS.get(setting)
        if field is None:
            raise SinkOptionError(
                f"unknown Kafka producer setting {name!r} for the tidelog sink; supported: "
                f"{', '.join('kafka.' + s for s in sorted([*SETTINGS, *_NO_EFFECT]))}"
            )
        value: Any = raw.strip()
        if setting in _INT_SETTINGS:
            try:
                value = int(value)
            except ValueError:
                raise SinkOptionError(f"option {name!r} must be an integer, got {raw!r}") from None
        elif setting == "acks":
            if value == "0":
                raise SinkOptionError(
                    f"option {name!r}=0 is refused: the sink needs the broker's answers to "
                    "write exactly once; use 'all' (the default) or 1"
                )
            value = value if value == "all" else _int_or_raw(value)
        settings[field] = value
    topic = source_options.get(options, "topic")
    if topic is not None:
        try:
            validate_topic_name(topic)
        except (TidelogError, ValueError) as exc:
            raise SinkOptionError(f"option 'topic': {exc}") from None
    writer_id = source_options.get(options, "writerId")
    if writer_id is not None and not 0 < len(writer_id) <= WRITER_ID_MAX_CHARS:
        raise SinkOptionError(
            f"option 'writerId' must have 1 to {WRITER_ID_MAX_CHARS} characters, "
            f"not {len(writer_id)}"
        )
    try:
        servers = source_options.servers(options)
        producer = ProducerConfig(bootstrap_servers=servers, **settings)
    except (ValueError, TypeError, TidelogError) as exc:
        raise SinkOptionError(f"tidelog sink: {exc}") from None
    return SinkOptions(topic, producer, writer_id)


def _int_or_raw(value: str) -> int | str:
    try:
        return int(value)
    except ValueError:
        return value


def check_schema(schema: StructType, options: SinkOptions) -> None:
    """The columns of Spark's Kafka sink, with their types (module doc)."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise SinkOptionError(
            f"the tidelog sink needs a 'value' column (binary or string); the columns are "
            f"{', '.join(fields) or 'none'}"
        )
    _check_type(fields, "value", _BINARY_OR_STRING, "binary or string")
    _check_type(fields, "key", _BINARY_OR_STRING, "binary or string")
    _check_type(fields, "topic", (StringType,), "string")
    _check_type(fields, "partition", (IntegerType,), "int")
    headers = fields.get("headers")
    if headers is not None and not _is_headers_type(headers):
        raise SinkOptionError(
            f"column 'headers' is {headers.simpleString()}; the tidelog sink needs "
            "array<struct<key:string,value:binary>>"
        )
    if "topic" not in fields and options.topic is None:
        raise SinkOptionError(
            "the tidelog sink needs a 'topic' option or a 'topic' column: neither is given"
        )


def _check_type(
    fields: Mapping[str, DataType], name: str, types: tuple[type, ...], wanted: str
) -> None:
    data_type = fields.get(name)
    if data_type is not None and not isinstance(data_type, types):
        raise SinkOptionError(
            f"column {name!r} is {data_type.simpleString()}; the tidelog sink needs {wanted}"
        )


def _is_headers_type(data_type: DataType) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    inner = {f.name: f.dataType for f in data_type.elementType.fields}
    return (
        set(inner) == {"key", "value"}
        and isinstance(inner["key"], StringType)
        and isinstance(inner["value"], BinaryType)
    )


def check_topic_exists(options: SinkOptions) -> None:
    """The `topic` option names a topic the cluster has (one Metadata call)."""
    if options.topic is None:
        return
    asyncio.run(_check_topic_exists(options.producer, options.topic))


async def _check_topic_exists(config: ProducerConfig, topic: str) -> None:
    cluster = Cluster(config)
    try:
        snapshot = await cluster.refresh([topic])
        meta = snapshot.topics.get(topic)
        if meta is None or isinstance(meta.error, UnknownTopicOrPartitionError):
            raise SinkOptionError(f"option 'topic': topic {topic!r} does not exist")
        if meta.error is not None:
            raise SinkOptionError(f"option 'topic': topic {topic!r}: {meta.error.message}")
    except TidelogError as exc:
        raise SinkOptionError(f"tidelog sink: cannot reach the cluster: {exc}") from None
    finally:
        await cluster.close()


def start(
    options: Mapping[str, str], schema: StructType, overwrite: bool = False, streaming: bool = False
) -> SinkOptions:
    """What both writers check on the driver before any task runs."""
    if overwrite:
        raise SinkOptionError(
            "a topic cannot be overwritten, only appended to: use mode('append') "
            "(a stream: outputMode('append'))"
        )
    parsed = parse_options(options)
    if streaming and parsed.writer_id is not None:
        raise SinkOptionError(
            "option 'writerId' is for df.write (in foreachBatch); a stream's writes are "
            "named by its query id and batch id already"
        )
    check_schema(schema, parsed)
    check_topic_exists(parsed)
    return parsed


# ---------------------------------------------------------------- writers


class SinkCommitMessage(WriterCommitMessage):
    """What one task wrote (`TaskResult`), sent to the driver's commit."""

    def __init__(self, result: TaskResult) -> None:
        self.result = result


def _task_partition() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the tidelog sink's write() runs in a Spark task")
    return context.partitionId()


def _local_property(name: str) -> str:
    from pyspark import TaskContext

    context = TaskContext.get()
    value = None if context is None else context.getLocalProperty(name)
    if value is None:
        raise RuntimeError(f"the Spark task has no {name!r}: not a streaming micro-batch?")
    return value


def _log_commit(kind: str, messages: list[Any]) -> None:
    results = [m.result for m in messages if isinstance(m, SinkCommitMessage)]
    replays = [r for r in results if r.replay]
    log.info(
        "tidelog sink %s committed: %d records from %d tasks (%d replayed; %d records sent "
        "again after lining up with earlier attempts)",
        kind,
        sum(r.total for r in results),
        len(results),
        len(replays),
        sum(r.total_resent for r in replays),
    )


class TidelogBatchWriter(DataSourceArrowWriter):
    """`df.write.format("tidelog")`: one writer key per task of this job, or
    of every job with the same `writerId` (a micro-batch that foreachBatch
    writes again after a restart is then written once)."""

    def __init__(self, options: SinkOptions) -> None:
        self._options = options
        # Chosen on the driver: every attempt of a task of this job shares it.
        self._job = f"id-{options.writer_id}" if options.writer_id else f"job-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        key = f"spark-sink/{self._job}/{_task_partition()}"
        return SinkCommitMessage(
            run_task(self._options.producer, self._options.topic, key, iterator)
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_commit(f"job {self._job}", list(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning(
            "tidelog sink job %s aborted: what its finished tasks wrote stays written", self._job
        )


class TidelogStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("tidelog")`: one writer key per (query, batch, task).

    The query id is the one kept in the checkpoint, and the batch id the one
    Spark replays, so a replayed micro-batch's tasks find their earlier
    attempts."""

    def __init__(self, options: SinkOptions) -> None:
        self._options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return SinkCommitMessage(
            run_task(self._options.producer, self._options.topic, self.writer_key(), iterator)
        )

    @staticmethod
    def writer_key() -> str:
        """This task's writer key, from the Spark task's context."""
        query = _local_property("sql.streaming.queryId")
        batch = _local_property("streaming.sql.batchId")
        return f"spark-sink/{query}/{batch}/{_task_partition()}"

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_commit(f"batch {batchId}", list(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "tidelog sink batch %d aborted: Spark runs it again with the same batch id, and "
            "what its tasks wrote is not written twice",
            batchId,
        )
