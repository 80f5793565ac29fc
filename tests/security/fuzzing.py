"""A seeded fuzzer for every RPC of every Tidelog service.

It knows the services only through their protobuf descriptors: every method of
every service in `tidelog.v1` and `tidelog.internal` is a target, and a case
is a list of request payloads (raw bytes) for one method:

- a message generated field by field from the request type, with values drawn
  from pools of "interesting" values (limits, negative counts, names that
  break the naming rule, regular expressions, the names of real topics and
  groups so that requests reach deep into the services);
- such a message serialized and then damaged (bytes flipped, cut short,
  garbage appended): the server's protobuf parser has to cope;
- random bytes;
- for every `bytes` field, often a record batch: a valid one, or one whose
  header lies about its length, record count, offset delta, magic or codec,
  with or without a recomputed CRC (so that the lie gets past the checksum
  and reaches the code behind it).

Every case draws from its own `random.Random(f"{seed}:{index}")`, so one
failing case replays alone from its seed and index (`Fuzzer.case`).

This module only builds cases; `tests/security/test_fuzz_services.py` sends
them and judges the answers.
"""

from __future__ import annotations

import contextlib
import random
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import crc32c
from google.protobuf import descriptor as pb_descriptor
from google.protobuf import message as pb_message
from google.protobuf import message_factory
from tidelog import records
from tidelog.compression import CompressionType

#: A generated message bigger than this is replaced by an empty one: the
#: fuzzer probes limits on counts and lengths with values in the header fields
#: and with long lists, not by shipping megabytes in every case.
MAX_CASE_BYTES = 256 * 1024

#: How often a field named in `Fuzzer(field_values=...)` takes one of those
#: values (the rest of the time, the pools' hostile ones).
FIELD_VALUES_SHARE = 0.85

_FD = pb_descriptor.FieldDescriptor

INTERESTING_INTS = (
    0, 1, -1, 2, 3, 7, 100, 1000, 65_535, 65_536,
    2**31 - 1, -(2**31), 2**32 - 1, 2**63 - 1, -(2**63), 2**64 - 1,
)  # fmt: skip

HOSTILE_STRINGS = (
    "",
    " ",
    "a" * 249,
    "a" * 250,
    "a" * 4097,
    "..",
    ".",
    "../../etc/passwd",
    "topic/with/slashes",
    "nul\x00byte",
    "é-accent",
    "\U0001f600",
    "*",
    ".*",
    "(a+)+$",
    "(a|a)*" * 20 + "b",
    "[",
    "(?<=x)y",
    "\\",
    "%s%s%n",
    "-1",
)

#: Record batches with codecs that a server without the extras cannot
#: decompress are still fair game: the answer must be a typed error.
_CODECS = tuple(CompressionType)


@dataclass(frozen=True)
class Target:
    """One method of one service, as the fuzzer sees it."""

    path: str  # "/tidelog.v1.Log/Produce"
    request: type[pb_message.Message]
    response: type[pb_message.Message]
    client_streaming: bool
    server_streaming: bool


@dataclass(frozen=True)
class Case:
    index: int
    target: Target
    kind: str  # "message", "damaged", "random", "empty"
    payloads: tuple[bytes, ...]

    def describe(self) -> str:
        sizes = ",".join(str(len(p)) for p in self.payloads)
        return f"case {self.index}: {self.target.path} {self.kind} payload bytes [{sizes}]"


def targets_of(modules: Sequence[ModuleType]) -> list[Target]:
    """Every method of every service declared in the given *_pb2 modules."""
    found: list[Target] = []
    for module in modules:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                found.append(
                    Target(
                        path=f"/{service.full_name}/{method.name}",
                        request=message_factory.GetMessageClass(method.input_type),
                        response=message_factory.GetMessageClass(method.output_type),
                        client_streaming=method.client_streaming,
                        server_streaming=method.server_streaming,
                    )
                )
    return found


class Fuzzer:
    """Builds case `index` of run `seed`, the same every time."""

    def __init__(
        self,
        seed: int,
        targets: Sequence[Target],
        *,
        names: Sequence[str] = (),
        broker_ids: Sequence[int] = (),
        field_values: Mapping[str, Sequence[object]] | None = None,
    ) -> None:
        """`field_values`: for a field of that name (any message; "key" and
        "value" for a map's), values drawn most of the time in place of the
        pools, so that requests whose fields a service checks one by one
        (an ACL binding's type, pattern, operation...) often pass them all."""
        self.seed = seed
        self.targets = list(targets)
        # Real names make a request pass the first checks and reach the code
        # behind them; hostile ones test the checks.
        self.strings = (*names, *names, *HOSTILE_STRINGS)
        self.ints = (*INTERESTING_INTS, *broker_ids)
        self.field_values = dict(field_values or {})

    def cases(self, count: int, start: int = 0) -> Iterator[Case]:
        for index in range(start, start + count):
            yield self.case(index)

    def case(self, index: int) -> Case:
        rng = random.Random(f"{self.seed}:{index}")
        target = rng.choice(self.targets)
        messages = rng.choice((1, 1, 1, 2, 3)) if target.client_streaming else 1
        roll = rng.random()
        if roll < 0.70:
            kind = "message"
            payloads = [self._message_bytes(rng, target.request) for _ in range(messages)]
        elif roll < 0.88:
            kind = "damaged"
            payloads = [damage(rng, self._message_bytes(rng, target.request))]
        elif roll < 0.97:
            kind = "random"
            payloads = [rng.randbytes(rng.choice((1, 2, 5, 17, 100, 1000, 5000)))]
        else:
            kind = "empty"
            payloads = [b""]
        return Case(index, target, kind, tuple(payloads))

    def _message_bytes(self, rng: random.Random, cls: type[pb_message.Message]) -> bytes:
        message = cls()
        self._fill(rng, message, depth=0)
        data = message.SerializeToString()
        return data if len(data) <= MAX_CASE_BYTES else b""

    def _fill(self, rng: random.Random, message: pb_message.Message, depth: int) -> None:
        for field in message.DESCRIPTOR.fields:
            if rng.random() < 0.25:
                continue  # left unset: defaults are inputs too
            if field.is_repeated:
                self._fill_repeated(rng, message, field, depth)
            elif field.type == _FD.TYPE_MESSAGE:
                if depth < 4:
                    self._fill(rng, getattr(message, field.name), depth + 1)
            else:
                _set(message, field, self._scalar(rng, field))

    def _fill_repeated(
        self,
        rng: random.Random,
        message: pb_message.Message,
        field: Any,
        depth: int,
    ) -> None:
        count = _count(rng, depth)
        container = getattr(message, field.name)
        if field.type == _FD.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
            key_field = field.message_type.fields_by_name["key"]
            value_field = field.message_type.fields_by_name["value"]
            for _ in range(count):
                key = self._scalar(rng, key_field)
                if value_field.type == _FD.TYPE_MESSAGE:
                    if depth < 4:
                        self._fill(rng, container[key], depth + 1)
                else:
                    _store_map(container, key, self._scalar(rng, value_field))
        elif field.type == _FD.TYPE_MESSAGE:
            if depth < 4 and count:
                # A long list repeats one element: its length is the probe.
                for _ in range(min(count, 4)):
                    self._fill(rng, container.add(), depth + 1)
                first = container[0]
                for _ in range(count - len(container)):
                    container.add().CopyFrom(first)
        else:
            for _ in range(min(count, 4)):
                _append(container, field, self._scalar(rng, field))
            if len(container) and count > len(container):
                container.extend([container[0]] * (count - len(container)))

    def _scalar(self, rng: random.Random, field: Any) -> object:
        likely = self.field_values.get(field.name)
        if likely and rng.random() < FIELD_VALUES_SHARE:
            return rng.choice(likely)
        kind = field.type
        if kind == _FD.TYPE_STRING:
            if rng.random() < 0.1:
                return "".join(chr(rng.randrange(1, 0x2FF)) for _ in range(rng.randrange(40)))
            return rng.choice(self.strings)
        if kind == _FD.TYPE_BYTES:
            return self._bytes(rng)
        if kind == _FD.TYPE_BOOL:
            return rng.random() < 0.5
        if kind in (_FD.TYPE_FLOAT, _FD.TYPE_DOUBLE):
            return rng.choice((0.0, -1.0, 1e300, float("inf"), float("nan")))
        if kind == _FD.TYPE_ENUM:
            values = [v.number for v in field.enum_type.values]
            return rng.choice((*values, *values, -1, 99, 2**31 - 1))
        value = rng.choice(self.ints) if rng.random() < 0.8 else rng.randrange(-1000, 100_000)
        return _clamp(value, kind)

    def _bytes(self, rng: random.Random) -> bytes:
        roll = rng.random()
        if roll < 0.35:
            return valid_batch(rng)
        if roll < 0.75:
            return lying_batch(rng)
        if roll < 0.85:
            return valid_batch(rng) + lying_batch(rng)
        return rng.randbytes(rng.choice((0, 1, 12, 60, 61, 62, 200, 4000)))


def _count(rng: random.Random, depth: int) -> int:
    roll = rng.random()
    if roll < 0.25:
        return 0
    if roll < 0.75:
        return 1
    if roll < 0.93 or depth > 0:
        return rng.randrange(2, 5)
    # Long lists at the top level: limits on counts must hold.
    return rng.choice((1_000, 5_000, 20_000))


_INT_RANGES = {
    _FD.TYPE_INT32: (-(2**31), 2**31 - 1),
    _FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    _FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    _FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    _FD.TYPE_SINT64: (-(2**63), 2**63 - 1),
    _FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    _FD.TYPE_UINT32: (0, 2**32 - 1),
    _FD.TYPE_FIXED32: (0, 2**32 - 1),
    _FD.TYPE_UINT64: (0, 2**64 - 1),
    _FD.TYPE_FIXED64: (0, 2**64 - 1),
}


def _clamp(value: int, kind: int) -> int:
    low, high = _INT_RANGES.get(kind, (-(2**63), 2**63 - 1))
    if low <= value <= high:
        return value
    # Wrap rather than clamp: both ends of a range are interesting.
    span = high - low + 1
    return (value - low) % span + low


# Values a field refuses (an enum value a closed enum does not know, a
# string that is not valid UTF-8) leave the field at its default.


def _set(message: pb_message.Message, field: Any, value: object) -> None:
    with contextlib.suppress(TypeError, ValueError):
        setattr(message, field.name, value)


def _append(container: Any, field: Any, value: object) -> None:
    with contextlib.suppress(TypeError, ValueError):
        container.append(value)


def _store_map(container: Any, key: object, value: object) -> None:
    with contextlib.suppress(TypeError, ValueError):
        container[key] = value


def damage(rng: random.Random, data: bytes) -> bytes:
    """Serialized bytes, flipped, cut or extended."""
    buf = bytearray(data or rng.randbytes(8))
    for _ in range(rng.randrange(1, 6)):
        action = rng.randrange(4)
        if action == 0 and buf:
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        elif action == 1 and len(buf) > 1:
            del buf[rng.randrange(1, len(buf)) :]
        elif action == 2:
            buf += rng.randbytes(rng.randrange(1, 30))
        elif buf:
            buf[rng.randrange(len(buf))] = rng.choice((0x00, 0x0A, 0x12, 0x7F, 0x80, 0xFF))
    return bytes(buf)


def valid_batch(rng: random.Random) -> bytes:
    """A batch that a broker accepts (given a codec it has)."""
    count = rng.choice((1, 1, 2, 5, 20))
    values = [rng.randbytes(rng.randrange(0, 64)) for _ in range(count)]
    keys = [rng.randbytes(rng.randrange(0, 8)) if rng.random() < 0.5 else None for _ in values]
    headers = [[(f"h{i}", rng.randbytes(3))] for i in range(count)] if rng.random() < 0.3 else None
    codec = rng.choice(_CODECS) if rng.random() < 0.3 else CompressionType.NONE
    try:
        return records.encode_batch(
            values, keys=keys, headers=headers, base_timestamp=1_700_000_000_000, codec=codec
        )
    except Exception:  # a codec whose library is not installed
        return records.encode_batch(values, keys=keys, base_timestamp=1_700_000_000_000)


_HEADER_FIELDS = {
    # name: (offset, struct format) in the 61-byte big-endian header
    "batch_length": (8, ">i"),
    "partition_leader_epoch": (12, ">i"),
    "magic": (16, ">b"),
    "attributes": (21, ">h"),
    "last_offset_delta": (23, ">i"),
    "base_timestamp": (27, ">q"),
    "max_timestamp": (35, ">q"),
    "producer_id": (43, ">q"),
    "producer_epoch": (51, ">h"),
    "base_sequence": (53, ">i"),
    "record_count": (57, ">i"),
}

_FIELD_LIES = {
    ">b": (0, 2, -1, 127, -128),
    ">h": (0, 7, 8, 0x7F, -1, 0x7FFF, -0x8000),
    ">i": (0, 1, -1, 2, 1000, 2**31 - 1, -(2**31), 1_000_000),
    ">q": (0, -1, 2**63 - 1, -(2**63), 1),
}


def lying_batch(rng: random.Random) -> bytes:
    """A valid batch with one to three header fields or body bytes lying,
    and the CRC recomputed half of the time."""
    buf = bytearray(valid_batch(rng))
    for _ in range(rng.randrange(1, 4)):
        roll = rng.random()
        if roll < 0.7 and len(buf) >= records.HEADER_SIZE:
            name = rng.choice(tuple(_HEADER_FIELDS))
            offset, fmt = _HEADER_FIELDS[name]
            current = struct.unpack_from(fmt, buf, offset)[0]
            lie = rng.choice((*_FIELD_LIES[fmt], current + 1, current - 1))
            lie = _clamp_struct(lie, fmt)
            struct.pack_into(fmt, buf, offset, lie)
        elif roll < 0.85 and len(buf) > records.HEADER_SIZE:
            position = rng.randrange(records.HEADER_SIZE, len(buf))
            buf[position] = rng.randrange(256)
        elif roll < 0.95 and len(buf) > 1:
            del buf[rng.randrange(1, len(buf)) :]
        else:
            buf += rng.randbytes(rng.randrange(1, 100))
    if rng.random() < 0.5 and len(buf) >= records.HEADER_SIZE:
        struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[records.CRC_START :])))
    return bytes(buf)


def _clamp_struct(value: int, fmt: str) -> int:
    bits = {">b": 8, ">h": 16, ">i": 32, ">q": 64}[fmt]
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return min(max(value, low), high)
