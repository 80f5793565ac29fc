"""The columnar read in C: tidelog._crecords.arrow_columns (the column pass)
and export_struct (the batch handed to pyarrow as one Arrow C array) and
their Python twins in tidelog.columnar give the same buffers, the same Arrow
batches and the same first error on the same fetches (every codec, nulls,
headers, sparse offsets, timestamps, LogAppendTime, a start inside a batch);
both refuse bodies whose columns lie, the C pass without reading outside
them; export_struct refuses buffers Arrow would read past, and gives every
buffer back when pyarrow lets go of the batch."""

from __future__ import annotations

import struct
import threading

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tidelog import columnar, records
from tidelog.compression import CODEC_MASK, CompressionType, decompress
from tidelog.records import HEADER_SIZE

from tests.unit.sdk.test_columnar import fetches, stored_batch
from tests.unit.sdk.test_records import HEADER_BLOCK_LIES, lying_header_block

pytestmark = pytest.mark.timeout(120)

needs_c = pytest.mark.skipif(
    records._crecords is None, reason="tidelog._crecords is not built (no C compiler at install)"
)
PASSES = {"c": columnar._column_pass_c, "python": columnar._column_pass_py}
ASSEMBLERS = {"c": columnar._assemble_c, "python": columnar._assemble_py}
# Where the header fields a body is checked against lie (records._HEADER).
_LAST_OFFSET_DELTA_AT, _RECORD_COUNT_AT = 23, 57


def decode_both(
    monkeypatch: pytest.MonkeyPatch, buf: bytes, *args: object, **kwargs: object
) -> dict[str, tuple[pa.RecordBatch, str | None]]:
    out = {}
    for name, column_pass in PASSES.items():
        monkeypatch.setattr(columnar, "_column_pass", column_pass)
        monkeypatch.setattr(columnar, "_assemble", ASSEMBLERS[name])
        batch, error = columnar.decode_fetch(buf, "t", 3, *args, **kwargs)  # type: ignore[arg-type]
        batch.validate(full=True)
        out[name] = (batch, None if error is None else error.message)
    return out


def as_bytes(buffer: object) -> bytes | None:
    return None if buffer is None else bytes(memoryview(buffer))  # type: ignore[arg-type]


def answers(buf: bytes) -> dict[str, tuple[object, ...]]:
    """Each pass's answer over every stored batch of `buf`, buffers as bytes."""
    headers, bodies = [], []
    pos = 0
    while pos < len(buf):
        header = records.read_header(buf, pos)
        headers.append(header)
        body = decompress(
            header.attributes & CODEC_MASK,
            memoryview(buf)[pos + HEADER_SIZE : pos + header.size],
            10**8,
        )
        bodies.append(memoryview(body))
        pos += header.size
    out = {}
    for name, column_pass in PASSES.items():
        answer = column_pass(bodies, headers)
        out[name] = tuple(
            as_bytes(field) if field_name in BUFFERS else field
            for field_name, field in zip(answer._fields, answer, strict=True)
        )
    return out


BUFFERS = {"offsets", "timestamps", "key_ends", "key_validity", "value_ends", "value_validity"}


@needs_c
@settings(max_examples=300, deadline=None)
@given(buf=fetches(), data=st.data())
def test_both_passes_give_the_same_batches(buf: bytes, data: st.DataObject) -> None:
    first = records.read_header(buf).base_offset
    start = data.draw(st.integers(first - 2, first + 60))
    end = data.draw(st.one_of(st.none(), st.integers(start, start + 80)))
    include_headers = data.draw(st.booleans())
    with pytest.MonkeyPatch.context() as monkeypatch:
        got = decode_both(monkeypatch, buf, start, end, include_headers=include_headers)
    (c_batch, c_error), (py_batch, py_error) = got["c"], got["python"]
    assert c_error is None and py_error is None
    assert c_batch.schema == py_batch.schema
    assert c_batch.equals(py_batch)
    for c_column, py_column in zip(c_batch.columns, py_batch.columns, strict=True):
        assert c_column.null_count == py_column.null_count


@needs_c
@settings(max_examples=300, deadline=None)
@given(buf=fetches())
def test_both_passes_write_the_same_buffers(buf: bytes) -> None:
    got = answers(buf)
    assert got["c"] == got["python"]


@st.composite
def lying_batch(draw: st.DrawFn) -> bytes:
    """An uncompressed batch whose column bytes, header counts or header
    blocks were overwritten at random (its CRC no longer holds: read
    unchecked)."""
    batch = bytearray(draw(stored_batch(draw(st.integers(0, 2**40)))))
    header = records.read_header(batch)
    if header.attributes & CODEC_MASK:
        batch = bytearray(
            records.encode_batch(
                [b"v" * draw(st.integers(0, 9)) for _ in range(draw(st.integers(1, 9)))],
                codec=CompressionType.NONE,
            )
        )
        header = records.read_header(batch)
    columns = records._read_columns(header, bytes(batch[HEADER_SIZE:]))
    columns_end = HEADER_SIZE + columns.payload_start
    kinds = ["column", "count", "last_delta"] + (["header_block"] if columns.header_bytes else [])
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(kinds))
        if kind == "header_block":
            # The blocks are the body's tail: a count, a key or value length
            # or key bytes that lie, in one block or across two.
            at = draw(st.integers(len(batch) - columns.header_bytes, len(batch) - 1))
            lie = draw(st.binary(min_size=1, max_size=4))[: len(batch) - at]
            batch[at : at + len(lie)] = lie
        elif kind == "column":
            at = draw(st.integers(HEADER_SIZE, columns_end - 1))
            lie = draw(st.binary(min_size=1, max_size=4))[: columns_end - at]
            batch[at : at + len(lie)] = lie
        else:
            field = _RECORD_COUNT_AT if kind == "count" else _LAST_OFFSET_DELTA_AT
            value = draw(st.integers(-3, 2**31 - 1) | st.integers(0, header.record_count + 3))
            struct.pack_into(">i", batch, field, value)
    return bytes(batch)


@needs_c
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(good=stored_batch(0), lying=lying_batch())
def test_lying_columns_are_refused_alike(good: bytes, lying: bytes) -> None:
    """A lying body stops the read at it with the same message from both
    passes; the records before it are returned, the same."""
    good_header = records.read_header(good)
    lying = bytearray(lying)
    records.set_base_offset(lying, 0, good_header.next_offset)
    buf = good + bytes(lying)
    with pytest.MonkeyPatch.context() as monkeypatch:
        got = decode_both(monkeypatch, buf, check_crcs=False, include_headers=True)
    assert got["c"][1] == got["python"][1]
    assert got["c"][0].equals(got["python"][0])
    assert got["c"][0].num_rows >= good_header.record_count


@needs_c
@pytest.mark.parametrize("lie", list(HEADER_BLOCK_LIES))
def test_a_miscounted_header_block_stops_both_reads_at_its_batch(lie: str) -> None:
    """A header block that counts too few headers (or whose last value runs
    past it) stops poll_arrow's read at its batch, C and Python alike, with
    check_body's message; the records before it are returned."""
    good = records.encode_batch([b"a", b"b"], headers=[[("k", b"v")], None])
    buf = good + lying_header_block(lie, base_offset=2)
    with pytest.MonkeyPatch.context() as monkeypatch:
        got = decode_both(monkeypatch, buf, include_headers=True)
    expected = (
        f"t-3: the batch at offset 2 (to 3) cannot be decoded: {HEADER_BLOCK_LIES[lie]}. "
        "Records before it were returned; seek to 4 to skip it"
    )
    for name, (batch, error) in got.items():
        assert batch.column("value").to_pylist() == [b"a", b"b"], name
        assert batch.column("headers").to_pylist() == [[{"key": "k", "value": b"v"}], None]
        assert error == expected, name


@pytest.mark.parametrize("name", ["c", "python"])
def test_a_length_column_that_claims_too_much_is_refused(name: str) -> None:
    if name == "c" and records._crecords is None:
        pytest.skip("tidelog._crecords is not built")
    batch = bytearray(records.encode_batch([b"ab", b"cd"], keys=[b"k", None]))
    header = records.read_header(batch)
    body = memoryview(batch)[HEADER_SIZE:]
    columns = records._read_columns(header, body)
    values_at = columns.payload_start - 4 * 2  # the value lengths come last
    struct.pack_into("<i", batch, HEADER_SIZE + values_at, 2**31 - 1)
    answer = PASSES[name]([memoryview(batch)[HEADER_SIZE:]], [header])
    assert answer.checked == 0 and answer.rows == 0
    assert answer.error is not None and "add up to" in answer.error
    struct.pack_into("<i", batch, HEADER_SIZE + values_at, -7)
    answer = PASSES[name]([memoryview(batch)[HEADER_SIZE:]], [header])
    assert answer.error == "malformed batch body: a value length is -7"


@needs_c
def test_the_c_pass_refuses_what_is_not_bodies_and_batches() -> None:
    assert records._crecords is not None
    arrow_columns = records._crecords.arrow_columns
    body = memoryview(records.encode_batch([b"a"]))[HEADER_SIZE:]
    with pytest.raises(TypeError):
        arrow_columns([body], [])  # not as many batches as bodies
    with pytest.raises(TypeError):
        arrow_columns([body], [(0, 1, 0, 0)])  # a batch of 4 fields
    with pytest.raises(TypeError):
        arrow_columns([object()], [(0, 1, 0, 0, True)])  # not a buffer
    checked, error, count, *_ = arrow_columns([body], [(0, 1, 0, 0, True)])
    assert (checked, error, count) == (1, None, 1)


def _export(columns: list[tuple[int, int, int, tuple[object, ...]]], length: int = 2) -> object:
    assert records._crecords is not None
    capsule, address = records._crecords.export_struct(length, columns)
    schema = pa.schema([pa.field(f"c{i}", _TYPES[c[2]]) for i, c in enumerate(columns)])
    batch = pa.RecordBatch._import_from_c(address, schema)
    del capsule
    return batch


_TYPES = {0: pa.binary(), 4: pa.int32(), 8: pa.int64()}
_ENDS = struct.pack("<3i", 0, 2, 5)


@needs_c
def test_export_struct_hands_over_the_buffers_it_is_given() -> None:
    data = bytearray(b"abcde")
    validity = bytes([0b10])
    ints = bytearray(struct.pack("<2i", 7, 8))
    batch = _export([(2, 1, 0, (validity, _ENDS, data)), (2, 0, 4, (None, ints))])
    batch.validate(full=True)
    assert batch.to_pydict() == {"c0": [None, b"cde"], "c1": [7, 8]}
    with pytest.raises(BufferError):
        data.append(0)  # held while pyarrow uses it: no copy was made
    del batch
    data.append(0)  # given back with the batch
    ints.append(0)


@needs_c
def test_export_struct_gives_the_buffers_back_from_any_thread() -> None:
    data = bytearray(b"abcde")
    batch = _export([(2, 0, 0, (None, _ENDS, data))])
    holder = [batch]
    del batch
    thread = threading.Thread(target=holder.clear)
    thread.start()
    thread.join(timeout=30)
    data.append(0)
    # Never imported: the capsule gives them back.
    assert records._crecords is not None
    capsule, _ = records._crecords.export_struct(2, [(2, 0, 0, (None, _ENDS, data))])
    with pytest.raises(BufferError):
        data.append(0)
    del capsule
    data.append(0)


@needs_c
@pytest.mark.parametrize(
    ("column", "length", "complaint"),
    [
        ((2, 0, 0, (None, _ENDS, b"abcd")), 2, "past its 4 data bytes"),
        ((2, 0, 0, (None, struct.pack("<3i", 0, 3, 2), b"abcde")), 2, "decrease"),
        ((2, 0, 0, (None, struct.pack("<3i", 1, 2, 3), b"abcde")), 2, "start at 0"),
        ((2, 0, 0, (None, _ENDS[:8], b"abcde")), 2, "offsets buffer too short"),
        ((2, 0, 8, (None, b"\0" * 15)), 2, "values buffer too short"),
        ((9, 1, 4, (b"\xff", b"\0" * 36)), 9, "validity bitmap too short"),
        ((2, 1, 4, (None, b"\0" * 8)), 2, "lacks buffer 0"),
        ((2, 3, 4, (None, b"\0" * 8)), 2, "do not make an Arrow column"),
        ((2, 0, 3, (None, b"\0" * 8)), 2, "do not make an Arrow column"),
        ((2, 0, 4, (None, b"\0" * 8)), 3, "holds 2 rows"),
    ],
)
def test_export_struct_refuses_what_arrow_would_read_past(
    column: tuple[int, int, int, tuple[object, ...]], length: int, complaint: str
) -> None:
    assert records._crecords is not None
    with pytest.raises(ValueError, match=complaint):
        records._crecords.export_struct(length, [column])
    with pytest.raises(TypeError):
        records._crecords.export_struct(2, [(2, 0)])
