"""The consumer's per-record loop: tidelog._crecords (C) and its Python twin
in tidelog.records build the same records from the same batches, and the C
loop refuses columns that would take it outside the body instead of reading
there."""

from __future__ import annotations

import random
import shutil
import sysconfig
from array import array
from collections import deque
from collections.abc import Callable
from pathlib import Path

import pytest
from tidelog import records
from tidelog._subscription import SubscriptionState
from tidelog.compression import CompressionType
from tidelog.config import ConsumerConfig
from tidelog.errors import InvalidRecordError, UndecodableBatchError
from tidelog.records import (
    HEADER_SIZE,
    LOG_APPEND_TIME,
    decode_records_at,
    encode_batch,
    read_header,
)
from tidelog.types import ConsumerRecord, TopicPartition

from tests.unit.sdk.test_records import HEADER_BLOCK_LIES, lying_header_block

pytestmark = pytest.mark.timeout(30)

needs_c = pytest.mark.skipif(
    records._crecords is None, reason="tidelog._crecords is not built (no C compiler at install)"
)
Builder = Callable[..., list[tuple]]
BUILDERS = {"c": records._build_records_c, "python": records._build_records_py}


def _payload(rng: random.Random, nulls: bool) -> bytes | None:
    if nulls and rng.random() < 0.2:
        return None
    return rng.randbytes(rng.choice([0, 1, 7, 100, 600]))


def _random_batch(rng: random.Random, base_offset: int) -> tuple[bytes, int]:
    """One batch of every kind the format allows, at random: nulls, headers,
    sparse offsets (compaction), per-record or shared timestamps,
    LogAppendTime, a codec. Returns it and the next offset."""
    count = rng.randint(1, 40)
    deltas = None
    if rng.random() < 0.3:
        deltas = sorted(rng.sample(range(count * 3), count))
    headers = None
    if rng.random() < 0.3:
        headers = [[("h", b"x"), ("n", None)] if rng.random() < 0.5 else None for _ in range(count)]
    batch = encode_batch(
        [_payload(rng, nulls=True) for _ in range(count)],
        keys=[_payload(rng, nulls=True) for _ in range(count)] if rng.random() < 0.6 else None,
        timestamps=[rng.randint(0, 2**41) for _ in range(count)] if rng.random() < 0.5 else None,
        base_timestamp=1_700_000_000_000,
        headers=headers,
        offset_deltas=deltas,
        codec=rng.choice([CompressionType.NONE, CompressionType.NONE, CompressionType.GZIP]),
        base_offset=base_offset,
        partition_leader_epoch=rng.randint(-1, 9),
        timestamp_type=LOG_APPEND_TIME if rng.random() < 0.2 else 0,
    )
    return batch, base_offset + (deltas[-1] if deltas else count - 1) + 1


def _all_records(buf: bytes, start: int) -> list[tuple]:
    out: list[tuple] = []
    pos = 0
    while pos < len(buf):
        header = read_header(buf, pos)
        if header.next_offset > start:
            out += decode_records_at(buf, pos, header, ConsumerRecord, "topic", 3, start)
        pos += header.size
    return out


@needs_c
def test_the_c_loop_builds_what_the_python_loop_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(20261126)
    for _ in range(60):
        parts = []
        offset = rng.randint(0, 2**40)
        first = offset
        for _ in range(rng.randint(1, 4)):
            batch, offset = _random_batch(rng, offset)
            parts.append(batch)
        buf = b"".join(parts)
        start = rng.randint(first, offset)  # a position inside the fetch, as after a seek
        built = {}
        for name, builder in BUILDERS.items():
            monkeypatch.setattr(records, "_build_records", builder)
            built[name] = _all_records(buf, start)
        assert built["c"] == built["python"]
        assert all(type(r) is ConsumerRecord for r in built["c"])
        assert all(r.offset >= start for r in built["c"])


def _columns_of(values: list[bytes | None]) -> tuple[bytes, records.BatchHeader, records._Columns]:
    buf = encode_batch(values)
    header = read_header(buf, 0)
    body = memoryview(buf)[HEADER_SIZE:]
    return buf, header, records._read_columns(header, body)


def _c_build(buf: bytes, columns: records._Columns, **changes: object) -> list[tuple]:
    assert records._crecords is not None
    args = {
        "record_type": ConsumerRecord,
        "topic": "t",
        "partition": 0,
        "timestamp_type": 0,
        "leader_epoch": -1,
        "blob": buf,
        "payload_pos": HEADER_SIZE + columns.payload_start,
        "base_offset": 0,
        "deltas": columns.deltas,
        "timestamps": columns.timestamps,
        "timestamp": 0,
        "key_lengths": columns.key_lengths,
        "value_lengths": columns.value_lengths,
        "headers": None,
        "no_headers": (),
        "start": 0,
    }
    args.update(changes)
    return records._crecords.build_records(*args.values())


@needs_c
def test_the_c_loop_reads_nothing_outside_the_body() -> None:
    buf, _, columns = _columns_of([b"a" * 10, b"b" * 10])
    assert [r.value for r in _c_build(buf, columns)] == [b"a" * 10, b"b" * 10]
    liars = {
        "a value longer than the body": {"value_lengths": array("i", [10, 10_000])},
        "a length below -1": {"value_lengths": array("i", [10, -5])},
        "a key past the body": {"key_lengths": array("i", [2**31 - 1, -1])},
        "a payload start past the end": {"payload_pos": len(buf) + 1},
        "a negative payload start": {"payload_pos": -1},
        "columns of different lengths": {"key_lengths": array("i", [-1])},
        "timestamps for one record of two": {"timestamps": array("q", [1])},
        "headers for one record of two": {"headers": [[]]},
        "a truncated blob": {"blob": buf[:-5]},
    }
    for lie, change in liars.items():
        with pytest.raises(ValueError, match=r"malformed batch body|outside the blob"):
            _c_build(buf, columns, **change)
            pytest.fail(f"accepted {lie}")


@needs_c
def test_the_c_loop_refuses_what_is_not_a_record_type_or_a_column() -> None:
    buf, _, columns = _columns_of([b"a"])
    with pytest.raises(TypeError, match="tuple subclass"):
        _c_build(buf, columns, record_type=dict)
    with pytest.raises(TypeError, match="list or None"):
        _c_build(buf, columns, headers=({},))
    with pytest.raises(ValueError, match="whole number"):
        _c_build(buf, columns, timestamps=b"123")
    with pytest.raises(TypeError):
        _c_build(buf, columns, value_lengths=None)


@pytest.mark.parametrize("builder", list(BUILDERS))
def test_a_lying_body_is_refused_by_either_loop(
    builder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if builder == "c" and records._crecords is None:
        pytest.skip("tidelog._crecords is not built")
    monkeypatch.setattr(records, "_build_records", BUILDERS[builder])
    buf = bytearray(encode_batch([b"x" * 20, b"y" * 20]))
    # The second value length claims more than the body holds (the CRC is
    # not checked here: the consumer checks it first, see _subscription).
    lengths_at = HEADER_SIZE + 1 + 4 * 2  # flags, key lengths
    buf[lengths_at + 4 : lengths_at + 8] = (1_000).to_bytes(4, "little")
    with pytest.raises(InvalidRecordError, match="add up to"):
        decode_records_at(bytes(buf), 0, read_header(buf, 0), ConsumerRecord, "t", 0, 0)


@pytest.mark.parametrize("lie", list(HEADER_BLOCK_LIES))
@pytest.mark.parametrize("deserialized", [False, True])
@pytest.mark.parametrize("builder", list(BUILDERS))
def test_a_miscounted_header_block_stops_the_consumer_at_its_batch(
    builder: str, deserialized: bool, lie: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header block that counts too few headers (or whose last value runs
    past it) is refused by either loop, plain or through deserializers, as
    check_body refuses it: the records before its batch are returned, then
    an UndecodableBatchError naming the batch and check_body's message."""
    if builder == "c" and records._crecords is None:
        pytest.skip("tidelog._crecords is not built")
    monkeypatch.setattr(records, "_build_records", BUILDERS[builder])
    good = encode_batch([b"a", b"b"], headers=[[("k", b"v")], None])
    buf = good + lying_header_block(lie, base_offset=2)
    deserializers = {"value_deserializer": bytes.decode} if deserialized else {}
    config = ConsumerConfig(bootstrap_servers="127.0.0.1:1", **deserializers)
    state = SubscriptionState(config, deque(), lambda name, args: None)
    got, error = state._decode(TopicPartition("t", 0), buf, 0)
    assert [(r.offset, list(r.headers)) for r in got] == [(0, [("k", b"v")]), (1, [])]
    assert isinstance(error, UndecodableBatchError)
    assert (error.offset, error.next_offset) == (2, 4)
    assert HEADER_BLOCK_LIES[lie] in error.message


def test_the_c_loop_is_built_where_a_compiler_is() -> None:
    """`make install` builds it whenever the machine has a C compiler (the
    build is optional, so a broken build would otherwise go unnoticed)."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    python_h = Path(sysconfig.get_paths()["include"], "Python.h")
    if shutil.which(compiler) is None or not python_h.exists():
        pytest.skip(f"no C compiler ({compiler}) or no {python_h}: the Python loop is the one")
    assert records._crecords is not None
    assert records._build_records is records._build_records_c
