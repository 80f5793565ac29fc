"""The driver's view of the source: partitions, offsets, and ranges to read.

`OffsetReader` (Kafka's source has a class of that name) answers, through one
SDK Consumer used without a group: which partitions the options select now
(subscribe, subscribePattern, assign), and their earliest, latest and
by-time offsets. It is created lazily and dropped when pickled: Spark
pickles the readers that hold it to other processes.

Offsets travel as Spark's Kafka source writes them, JSON
`{"topic": {"0": 23, "1": -1}}` (-2 earliest, -1 latest), always with topics
and partitions in sorted order: Spark compares offsets as JSON strings, and
the same offsets written in another order would look like new data.

`plan_ranges` turns per-partition [start, end) into Spark tasks, splitting a
partition's range over several tasks when minPartitions asks for more tasks
than there are partitions (Kafka's KafkaOffsetRangeCalculator).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tidelog.consumer import Consumer
from tidelog.errors import UnknownTopicOrPartitionError
from tidelog.spark.options import EARLIEST, LATEST, SourceOptionError, SourceOptions
from tidelog.types import TopicPartition

log = logging.getLogger(__name__)

TP = tuple[str, int]
Offsets = dict[TP, int]

#: How long the partition list and the latest offsets are reused: Spark's
#: default trigger asks for the latest offset ~100 times a second when idle.
PARTITIONS_TTL_S = 1.0
LATEST_TTL_S = 0.1


def to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """Offsets as Kafka's source writes them, topics and partitions sorted."""
    out: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        out.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return out


def from_json(offsets: Mapping[str, Any]) -> Offsets:
    """The inverse of to_json (Spark hands offsets back with string keys)."""
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in offsets.items()
        for partition, offset in partitions.items()
    }


class DataLossError(RuntimeError):
    """Records a query was to read are gone (retention, or a deleted topic)
    and failOnDataLoss is true."""


def report_data_loss(fail: bool, message: str) -> None:
    """Kafka's source's wording: fail, or log and go on."""
    if fail:
        raise DataLossError(
            f"{message}. Some data may have been lost because they are not available in "
            "Tidelog any more; either the data was aged out by retention or the topic may "
            "have been deleted before all the data in the topic was processed. If you do not "
            "want your streaming query to fail on such cases, set the source option "
            "'failOnDataLoss' to 'false'."
        )
    log.warning("%s. Some data may have been lost (failOnDataLoss=false: going on).", message)


class OffsetReader:
    """Partitions and offsets of the selected topics (see the module doc)."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._consumer: Consumer | None = None
        self._partitions: tuple[float, list[TP]] | None = None
        self._latest: tuple[float, Offsets] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_consumer"] = None
        state["_partitions"] = None
        state["_latest"] = None
        return state

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(
                bootstrap_servers=self._options.servers,
                client_id="tidelog-spark-driver",
                enable_auto_commit=False,
            )
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            consumer.close(autocommit=False)

    # ------------------------------------------------------------ partitions

    def partitions(self, at_start: bool = False) -> list[TP]:
        """The partitions read now, sorted. At start, a subscribed topic or
        an assigned partition that does not exist is a SourceOptionError
        naming the option; later it is left out (the planner reports the
        loss)."""
        now = time.monotonic()
        if not at_start and self._partitions is not None:
            when, cached = self._partitions
            if now - when < PARTITIONS_TTL_S:
                return cached
        found = self._find_partitions(at_start)
        self._partitions = (now, found)
        return found

    def _find_partitions(self, at_start: bool) -> list[TP]:
        options = self._options
        client = self._client()
        out: list[TP] = []
        if options.strategy == "subscribe":
            for topic in options.topics:
                partitions = client.partitions_for_topic(topic)
                if partitions is None:
                    if at_start:
                        raise SourceOptionError(
                            f"topic {topic!r} named by option 'subscribe' does not exist"
                        )
                    continue
                out.extend((topic, p) for p in partitions)
        elif options.strategy == "subscribePattern":
            for topic in sorted(client.topics()):
                if options.matches(topic):
                    partitions = client.partitions_for_topic(topic)
                    out.extend((topic, p) for p in partitions or ())
        else:
            counts: dict[str, int | None] = {}
            for topic, partition in options.assigned:
                if topic not in counts:
                    partitions = client.partitions_for_topic(topic)
                    counts[topic] = None if partitions is None else len(partitions)
                count = counts[topic]
                if count is None or partition >= count:
                    if at_start:
                        what = "does not exist" if count is None else f"has {count} partitions"
                        raise SourceOptionError(
                            f"option 'assign' names {topic}-{partition}, but topic {topic!r} {what}"
                        )
                    continue
                out.append((topic, partition))
        return sorted(out)

    # ------------------------------------------------------------ offsets

    def _existing(self, tps: list[TP]) -> list[TP]:
        """Those of `tps` that exist now (after a lookup found one missing:
        a topic deleted since the partitions were listed)."""
        self._partitions = None
        self._latest = None
        found = set(self._find_partitions(at_start=False))
        return [tp for tp in tps if tp in found]

    def _list(self, tps: Iterable[TP], latest: bool) -> Offsets:
        """Earliest or latest offsets of those of `tps` that still exist."""
        query = list(tps)
        for attempt in range(3):
            if not query:
                return {}
            client = self._client()
            look_up = client.end_offsets if latest else client.beginning_offsets
            try:
                found = look_up([TopicPartition(*tp) for tp in query])
            except UnknownTopicOrPartitionError:
                if attempt == 2:
                    raise
                query = self._existing(query)
                continue
            return {(tp.topic, tp.partition): offset for tp, offset in found.items()}
        return {}

    def earliest(self, tps: Iterable[TP]) -> Offsets:
        """Earliest offsets; a partition gone meanwhile is left out."""
        return self._list(tps, latest=False)

    def latest(self, tps: Iterable[TP], fresh: bool = False) -> Offsets:
        """Latest offsets (reused for LATEST_TTL_S unless `fresh`); a
        partition gone meanwhile is left out."""
        wanted = list(tps)
        now = time.monotonic()
        if not fresh and self._latest is not None:
            when, cached = self._latest
            if now - when < LATEST_TTL_S and all(tp in cached for tp in wanted):
                return {tp: cached[tp] for tp in wanted}
        latest = self._list(wanted, latest=True)
        self._latest = (now, latest)
        return latest

    def by_time(self, times: Mapping[TP, int]) -> dict[TP, int | None]:
        """The first offset at or after each time; None where there is none."""
        if not times:
            return {}
        found = self._client().offsets_for_times(
            {TopicPartition(*tp): ts for tp, ts in times.items()}
        )
        return {
            (tp.topic, tp.partition): None if found_at is None else found_at.offset
            for tp, found_at in found.items()
        }

    def resolve(self, offsets: Mapping[TP, int], tps: Iterable[TP]) -> Offsets:
        """Concrete offsets of `tps`: -2/-1 in `offsets` become the earliest
        and latest offsets; a partition `offsets` lacks (a new one) starts at
        its earliest, as in Kafka's source. A partition gone meanwhile is
        left out."""
        wanted = list(tps)
        need_earliest = [tp for tp in wanted if offsets.get(tp, EARLIEST) == EARLIEST]
        need_latest = [tp for tp in wanted if offsets.get(tp) == LATEST]
        earliest = self.earliest(need_earliest)
        latest = self.latest(need_latest, fresh=True)
        out: Offsets = {}
        for tp in wanted:
            value = offsets.get(tp, EARLIEST)
            if value == EARLIEST:
                if tp in earliest:
                    out[tp] = earliest[tp]
            elif value == LATEST:
                if tp in latest:
                    out[tp] = latest[tp]
            else:
                out[tp] = value
        return out


# ---------------------------------------------------------------- planning


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def plan_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """One range per partition, or, when minPartitions asks for more tasks
    than there are ranges, each range split in pieces in proportion to its
    size (at least one each; Kafka's source's rule)."""
    ranges = [r for r in ranges if r.size > 0]
    if min_partitions is None or min_partitions <= len(ranges):
        return ranges
    total = sum(r.size for r in ranges)
    out: list[OffsetRange] = []
    for r in ranges:
        parts = max(1, round(r.size / total * min_partitions))
        step = r.size / parts
        bounds = [r.start + math.floor(i * step) for i in range(parts)] + [r.end]
        out.extend(
            OffsetRange(r.topic, r.partition, a, b) for a, b in itertools.pairwise(bounds) if b > a
        )
    return out


def rate_limit(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """End offsets reading at most about `max_rows` records, shared between
    partitions in proportion to what each has to read (Kafka's rateLimit)."""
    sizes = {tp: latest[tp] - start.get(tp, latest[tp]) for tp in latest}
    total = sum(size for size in sizes.values() if size > 0)
    if total <= max_rows:
        return dict(latest)
    out: Offsets = {}
    for tp, end in latest.items():
        begin = start.get(tp, end)
        size = sizes[tp]
        if size <= 0:
            out[tp] = end
            continue
        share = max_rows * size / total
        out[tp] = min(end, begin + (math.ceil(share) if share < 1 else math.floor(share)))
    return out
