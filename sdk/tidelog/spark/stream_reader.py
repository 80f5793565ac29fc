"""`spark.readStream.format("tidelog")`: the micro-batch stream reader.

Spark (in one long-lived Python process on the driver) asks for the initial
offset, then at every trigger for the latest offset given the previous end
and a read limit, then for the partitions (tasks) between the two; tasks run
`read` elsewhere, on a pickled copy. Offsets are Kafka's source's JSON (see
`offsets`). The semantics are Kafka's source's:

- `initialOffset`: startingOffsets. earliest and latest stay symbolic (-2,
  -1 per partition) and are resolved when the first batch is planned: Spark
  does not checkpoint the initial offset, so it must be the same when asked
  again after a restart. Times are resolved to offsets when the query starts.
- `latestOffset`: the partitions read now (new partitions and, with a
  pattern, new topics included: they start at their earliest offset) at
  their latest offsets, cut by maxOffsetsPerTrigger (in proportion to each
  partition's backlog) or, under Trigger.AvailableNow, by the offsets seen
  when the query started.
- `partitions`: one task per partition range, or more with minPartitions;
  records gone (retention, a deleted topic, offsets going back) are
  reported by failOnDataLoss: a clear error, or a logged skip.

`commit` does nothing: Spark's checkpoint holds the progress, and the
records stay in Tidelog for other readers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from tidelog.spark import offsets as offs
from tidelog.spark.options import EARLIEST, LATEST, SourceOptionError, SourceOptions
from tidelog.spark.read import RangePartition, read_range

log = logging.getLogger(__name__)


class TidelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The stream reader (see the module doc)."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._offsets = offs.OffsetReader(options)
        self._available_now: offs.Offsets | None = None
        # Checked now, so that a missing topic or a bad starting position
        # fails the query at start, naming the option.
        self._initial = self._starting_offsets(self._offsets.partitions(at_start=True))

    def _starting_offsets(self, tps: list[offs.TP]) -> offs.Offsets:
        spec = self._options.starting
        if spec.kind == "earliest":
            return dict.fromkeys(tps, EARLIEST)
        if spec.kind == "latest":
            return dict.fromkeys(tps, LATEST)
        if spec.kind == "offsets":
            assert spec.offsets is not None
            unknown = sorted(set(spec.offsets) - set(tps))
            if unknown:
                raise SourceOptionError(
                    f"option 'startingOffsets' names partitions that are not read: "
                    f"{', '.join(f'{t}-{p}' for t, p in unknown)}"
                )
            # Partitions it leaves out start at their earliest (as new ones do).
            return {tp: spec.offsets.get(tp, EARLIEST) for tp in tps}
        times = starting_times(self._options, tps)
        found = self._offsets.by_time(times)
        out: offs.Offsets = {}
        for tp in tps:
            if tp not in times:
                out[tp] = EARLIEST
            elif found.get(tp) is not None:
                out[tp] = found[tp]  # type: ignore[assignment]
            elif self._options.by_timestamp_strategy == "latest":
                out[tp] = LATEST
            else:
                raise SourceOptionError(
                    f"no record of {tp[0]}-{tp[1]} at or after the starting time {times[tp]} "
                    "(option 'startingTimestamp'/'startingOffsetsByTimestamp'); set "
                    "'startingOffsetsByTimestampStrategy' to 'latest' to start at the end"
                )
        return out

    # ------------------------------------------------------------ offsets

    def initialOffset(self) -> dict:
        return offs.to_json(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self._options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._offsets.latest(self._offsets.partitions(), fresh=True)

    def _latest(self) -> offs.Offsets:
        if self._available_now is not None:
            return dict(self._available_now)
        return self._offsets.latest(self._offsets.partitions())

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest = self._latest()
        if isinstance(limit, ReadMaxRows):
            begin = self._offsets.resolve(offs.from_json(start), list(latest))
            # A partition whose start is past its end (recreated) reads nothing
            # here; planning reports it.
            begin = {tp: min(begin.get(tp, latest[tp]), latest[tp]) for tp in latest}
            latest = offs.rate_limit(begin, latest, limit.max_rows)
        return offs.to_json(latest)

    def reportLatestOffset(self) -> dict | None:
        return offs.to_json(self._latest())

    # ------------------------------------------------------------ planning

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = plan(self._offsets, self._options, offs.from_json(start), offs.from_json(end))
        return [
            RangePartition(
                r.topic,
                r.partition,
                r.start,
                r.end,
                self._options.servers,
                self._options.include_headers,
                self._options.fail_on_data_loss,
                self._options.poll_timeout_ms,
            )
            for r in ranges
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_range(partition)

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        self._offsets.close()


def starting_times(options: SourceOptions, tps: list[offs.TP]) -> dict[offs.TP, int]:
    """startingTimestamp (every partition) or startingOffsetsByTimestamp."""
    spec = options.starting
    if spec.kind == "timestamp":
        assert spec.timestamp is not None
        return dict.fromkeys(tps, spec.timestamp)
    assert spec.timestamps is not None
    unknown = sorted(set(spec.timestamps) - set(tps))
    if unknown:
        raise SourceOptionError(
            "option 'startingOffsetsByTimestamp' names partitions that are not read: "
            f"{', '.join(f'{t}-{p}' for t, p in unknown)}"
        )
    return dict(spec.timestamps)


def plan(
    reader: offs.OffsetReader,
    options: SourceOptions,
    start: offs.Offsets,
    end: offs.Offsets,
) -> list[offs.OffsetRange]:
    """The ranges between two offsets of a stream, with the checks of
    Kafka's source: partitions gone, records removed, offsets going back."""
    fail = options.fail_on_data_loss
    gone = sorted(set(start) - set(end))
    if gone:
        offs.report_data_loss(
            fail, f"{', '.join(f'{t}-{p}' for t, p in gone)} are gone (a deleted topic?)"
        )
    tps = sorted(end)
    begin = reader.resolve(start, tps)
    earliest = reader.earliest(tps)
    vanished = [tp for tp in tps if tp not in begin or tp not in earliest]
    if vanished:
        offs.report_data_loss(
            fail, f"{', '.join(f'{t}-{p}' for t, p in vanished)} are gone (a deleted topic?)"
        )
    ranges = []
    for tp in tps:
        if tp in vanished:
            continue
        first, last = begin[tp], end[tp]
        if start.get(tp) == LATEST:
            # "latest", resolved only now: nothing before the batch's end.
            first = min(first, last)
        if first < earliest[tp]:
            offs.report_data_loss(
                fail,
                f"{tp[0]}-{tp[1]}: records [{first}, {earliest[tp]}) were to be read but the "
                f"log now starts at {earliest[tp]}",
            )
            first = earliest[tp]
        if last < first:
            offs.report_data_loss(
                fail, f"{tp[0]}-{tp[1]}: the offset went back from {first} to {last}"
            )
            continue
        ranges.append(offs.OffsetRange(tp[0], tp[1], first, last))
    return offs.plan_ranges(ranges, options.min_partitions)
