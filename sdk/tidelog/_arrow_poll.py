"""`Consumer.poll_arrow`'s calling side: fetched data as Arrow, one batch per fetch.

Takes the fetcher's inbox items as `SubscriptionState.collect` does, but
decodes each fetch answer's bytes with `tidelog.columnar` into one pyarrow
RecordBatch instead of ConsumerRecords, and moves the partition's position
past it. Resets and partition errors go through the SubscriptionState as in
poll(). Records that poll() or iteration decoded but did not return come
first, converted (the per-record path, only when the two calls are mixed),
so nothing is skipped or returned twice. A paused partition's answers are
kept (decoded per record) for after resume(), as poll() keeps them.

It works on the SubscriptionState's internals (one module of the same
package): the positions, credit and error rules stay those of
`_subscription`, written once.
"""

from __future__ import annotations

import pyarrow as pa

from tidelog._fetch_wire import FetchedPartition
from tidelog._fetcher import DATA
from tidelog._subscription import _EMPTY, SubscriptionState
from tidelog.columnar import decode_fetch, records_to_arrow
from tidelog.types import TopicPartition

ArrowBatches = dict[TopicPartition, list[pa.RecordBatch]]


def collect_arrow(subs: SubscriptionState, include_headers: bool) -> ArrowBatches:
    """Everything fetched so far, without waiting, as RecordBatches per
    partition (in offset order). Raises a partition error only when nothing
    is returned with it (otherwise on the next call), as collect() does."""
    subs._raise_unraised()
    subs._raise_undecodable()
    out: ArrowBatches = {}
    for state in list(subs._ready):
        held = state.records[state.index :]
        state.records = _EMPTY
        state.index = 0
        subs._ready.remove(state)
        if held:
            out.setdefault(state.tp, []).append(records_to_arrow(held, include_headers))
    inbox = subs._inbox
    try:
        while inbox:
            item = inbox.popleft()
            if item[0] != DATA:
                subs._take(item)
                if subs._unraised:
                    break  # an error comes after the records before it
                continue
            _, session, tp, data = item
            size = data.records_size
            if size:
                subs._credit[session.id] = subs._credit.get(session.id, 0) + size
                subs._credit_total += size
            batch = _take_arrow(subs, tp, data, include_headers)
            if batch is not None and batch.num_rows:
                out.setdefault(tp, []).append(batch)
    finally:
        if subs._credit_total >= subs._grant_threshold:
            subs.flush_credit()
    if not out:
        subs._raise_unraised()
        subs._raise_undecodable()
    return out


def _take_arrow(
    subs: SubscriptionState,
    tp: TopicPartition,
    data: FetchedPartition,
    include_headers: bool,
) -> pa.RecordBatch | None:
    """One fetch answer as a RecordBatch (None: an answer to an old position,
    or kept for a paused partition)."""
    state = subs._states.get(tp)
    if state is None:
        return None
    fetched_to = state.fetched_to
    if fetched_to is None or not data.fetch_offset <= fetched_to < data.next_offset:
        return None  # an answer for an old position
    if state.error is not None:
        return None  # stopped at a bad batch until the application seeks
    if state.paused or state.index < len(state.records):
        subs._take_data(tp, data)
        return None
    state.highwater = data.high_watermark
    batch, error = decode_fetch(
        # decode_fetch reads any buffer: the answer is not copied out of
        # gRPC's message first (a 200 KB copy and allocation per fetch).
        data.records_view(),
        tp.topic,
        tp.partition,
        fetched_to,
        include_headers=include_headers,
        check_crcs=subs._check_crcs,
        max_uncompressed_bytes=subs._max_batch_bytes,
    )
    if error is None:
        state.fetched_to = data.next_offset
    else:
        # The position stops at the bad batch: the records before it are
        # returned, then every call raises until the application seeks.
        state.fetched_to = max(fetched_to, error.offset)
        state.error = error
        subs._failed[tp] = state
    return batch
