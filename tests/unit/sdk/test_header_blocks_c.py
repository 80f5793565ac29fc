"""tidelog._cproduce.header_blocks writes a batch's header columns byte for byte as the
Python path of tidelog.records does, and leaves to that path (None) every input it does not
take exactly, so that the Python path's own errors still apply."""

from __future__ import annotations

import random
from array import array

import pytest
from tidelog import records
from tidelog.records import decode_batches, encode_batch

_cproduce = records._cproduce
pytestmark = pytest.mark.skipif(_cproduce is None, reason="tidelog._cproduce not built")


def python_columns(headers: list) -> tuple[bytes, bytes]:
    blocks = [records._encode_headers(h) for h in headers]
    return records._le_bytes(array("i", map(len, blocks))), b"".join(blocks)


def random_headers(rng: random.Random) -> list:
    keys = ["trace-id", "k", "", "clé", "ключ", "x" * 300, "k" * 0xFFFF]
    out: list = []
    for _ in range(rng.randrange(1, 30)):
        shape = rng.random()
        if shape < 0.15:
            out.append(None)
        elif shape < 0.25:
            out.append([] if rng.random() < 0.5 else ())
        else:
            items = [
                (rng.choice(keys), rng.choice([None, b"", b"v" * rng.randrange(0, 300)]))
                for _ in range(rng.randrange(1, 5))
            ]
            out.append(items if rng.random() < 0.7 else tuple(items))
    return out


def test_the_columns_are_the_python_paths() -> None:
    assert _cproduce is not None
    rng = random.Random(5)
    for _ in range(300):
        headers = random_headers(rng)
        assert _cproduce.header_blocks(headers) == python_columns(headers)


class Key(str):
    pass


class Pair(tuple):  # type: ignore[type-arg]
    pass


@pytest.mark.parametrize(
    "record",
    [
        [("k" * 0x10000, b"v")],  # a key over a u16 length
        [("\ud800", b"v")],  # a key UTF-8 cannot encode
        [(Key("k"), b"v")],
        [Pair(("k", b"v"))],
        [("k", bytearray(b"v"))],
        [("k", "v")],
        [("k",)],
        iter([("k", b"v")]),
        [("k", b"")] * 0x10000,  # more headers than a u16 count
    ],
    ids=[
        "long-key",
        "surrogate",
        "str-subclass",
        "tuple-subclass",
        "bytearray",
        "str-value",
        "one-item",
        "iterator",
        "too-many",
    ],
)
def test_what_it_does_not_take_exactly_is_left_to_python(record: object) -> None:
    assert _cproduce is not None
    assert _cproduce.header_blocks([[("ok", b"1")], record]) is None


def test_encode_batch_writes_the_same_bytes_with_and_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(9)
    for _ in range(50):
        headers = random_headers(rng)
        values = [b"v%d" % i for i in range(len(headers))]
        with_c = encode_batch(values, headers=headers)
        with monkeypatch.context() as patch:
            patch.setattr(records, "_cproduce", None)
            without = encode_batch(values, headers=headers)
        assert with_c == without
        decoded = [h for batch in decode_batches(with_c) for h in batch.headers]
        assert [list(h) for h in decoded] == [
            [] if h is None else [(k, v) for k, v in h] for h in headers
        ]
