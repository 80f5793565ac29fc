"""`spark.read.format("tidelog")`: a batch read of fixed offset ranges.

From startingOffsets (earliest by default; or startingTimestamp,
startingOffsetsByTimestamp) to endingOffsets (latest by default; or
endingTimestamp, endingOffsetsByTimestamp), resolved once when Spark plans
the read, as Kafka's source does. A start past its end is an error naming
the options. Tasks read as the stream's do (`read.read_range`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from tidelog.spark import offsets as offs
from tidelog.spark.options import EARLIEST, LATEST, OffsetSpec, SourceOptionError, SourceOptions
from tidelog.spark.read import RangePartition, read_range


class TidelogBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._offsets = offs.OffsetReader(options)
        # Checked at once: a missing topic fails the read naming the option.
        self._offsets.partitions(at_start=True)

    def partitions(self) -> Sequence[InputPartition]:
        options = self._options
        try:
            tps = self._offsets.partitions(at_start=True)
            start = self._resolve(options.starting, "starting", tps)
            end = self._resolve(options.ending, "ending", tps)
        finally:
            self._offsets.close()
        ranges = []
        for tp in tps:
            if start[tp] > end[tp]:
                raise SourceOptionError(
                    f"{tp[0]}-{tp[1]}: the starting offset {start[tp]} is after the ending "
                    f"offset {end[tp]} (options 'starting...' and 'ending...')"
                )
            ranges.append(offs.OffsetRange(tp[0], tp[1], start[tp], end[tp]))
        return [
            RangePartition(
                r.topic,
                r.partition,
                r.start,
                r.end,
                options.servers,
                options.include_headers,
                options.fail_on_data_loss,
                options.poll_timeout_ms,
            )
            for r in offs.plan_ranges(ranges, options.min_partitions)
        ]

    def _resolve(self, spec: OffsetSpec, prefix: str, tps: list[offs.TP]) -> offs.Offsets:
        reader = self._offsets
        if spec.kind == "earliest":
            return reader.earliest(tps)
        if spec.kind == "latest":
            return reader.latest(tps, fresh=True)
        if spec.kind == "offsets":
            assert spec.offsets is not None
            unknown = sorted(set(spec.offsets) - set(tps))
            if unknown:
                raise SourceOptionError(
                    f"option '{prefix}Offsets' names partitions that are not read: "
                    f"{', '.join(f'{t}-{p}' for t, p in unknown)}"
                )
            default = EARLIEST if prefix == "starting" else LATEST
            return reader.resolve({tp: spec.offsets.get(tp, default) for tp in tps}, tps)
        if spec.kind == "timestamp":
            assert spec.timestamp is not None
            times = dict.fromkeys(tps, spec.timestamp)
        else:
            assert spec.timestamps is not None
            unknown = sorted(set(spec.timestamps) - set(tps))
            if unknown:
                raise SourceOptionError(
                    f"option '{prefix}OffsetsByTimestamp' names partitions that are not read: "
                    f"{', '.join(f'{t}-{p}' for t, p in unknown)}"
                )
            times = dict(spec.timestamps)
        found = reader.by_time(times)
        latest = reader.latest(tps, fresh=True)
        out: offs.Offsets = {}
        for tp in tps:
            if tp not in times:
                out[tp] = reader.earliest([tp])[tp] if prefix == "starting" else latest[tp]
                continue
            offset = found.get(tp)
            if offset is not None:
                out[tp] = offset
            elif prefix == "ending" or self._options.by_timestamp_strategy == "latest":
                out[tp] = latest[tp]
            else:
                raise SourceOptionError(
                    f"no record of {tp[0]}-{tp[1]} at or after the starting time {times[tp]} "
                    f"(option '{prefix}Timestamp'/'{prefix}OffsetsByTimestamp'); set "
                    "'startingOffsetsByTimestampStrategy' to 'latest' to start at the end"
                )
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_range(partition)
