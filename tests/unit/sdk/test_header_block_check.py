"""The check of a batch's header blocks (records.check_body, what a broker runs on every
produced batch that carries headers) gives the same verdict in C (tidelog._crecords) as the
Python walk: None for well-formed blocks, InvalidRecordError for the same damaged ones, with
the same message for a block whose headers do not fill its declared bytes."""

from __future__ import annotations

import random
from array import array

import pytest
from tidelog import records
from tidelog.errors import InvalidRecordError

pytestmark = pytest.mark.skipif(records._crecords is None, reason="tidelog._crecords not built")

U16, I32 = records._U16, records._I32


def block(headers: list[tuple[bytes, bytes | None]]) -> bytes:
    """One record's header block: count, then per header key length, key, value length
    (-1 for a null value), value."""
    out = bytearray(U16.pack(len(headers)))
    for key, value in headers:
        out += U16.pack(len(key)) + key
        out += I32.pack(-1 if value is None else len(value)) + (value or b"")
    return bytes(out)


def random_blocks(rng: random.Random) -> tuple[bytes, array]:
    keys = [b"trace-id", b"k", b"", "clé".encode(), "ключ".encode(), b"x" * 300]
    blocks, lengths = bytearray(), array("i")
    for _ in range(rng.randrange(0, 40)):
        if rng.random() < 0.2:
            lengths.append(rng.choice([0, -1]))  # a record without headers
            continue
        headers = [
            (rng.choice(keys), rng.choice([None, b"", b"v" * rng.randrange(0, 200)]))
            for _ in range(rng.randrange(0, 5))
        ]
        one = block(headers)
        blocks += one
        lengths.append(len(one))
    return bytes(blocks), lengths


def verdict(check: object, blocks: bytes, lengths: array) -> str | None:
    try:
        check(blocks, lengths)  # type: ignore[operator]
    except InvalidRecordError as exc:
        return exc.message
    return None


def test_well_formed_blocks_pass_both() -> None:
    rng = random.Random(7)
    for _ in range(300):
        blocks, lengths = random_blocks(rng)
        assert verdict(records._check_header_blocks_py, blocks, lengths) is None
        assert verdict(records._check_header_blocks_c, blocks, lengths) is None


def test_damaged_blocks_are_refused_alike() -> None:
    rng = random.Random(11)
    refused = 0
    for _ in range(2000):
        blocks, lengths = random_blocks(rng)
        if not blocks:
            continue
        damaged = bytearray(blocks)
        how = rng.randrange(4)
        if how == 0:  # a byte changed (a count, a length, a key byte)
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        elif how == 1:  # the blocks cut short
            del damaged[rng.randrange(len(damaged)) :]
        elif how == 2:  # a declared length that lies
            i = rng.randrange(len(lengths))
            lengths[i] += rng.choice([-3, -1, 1, 2, 1000])
        else:  # a key that is not UTF-8
            damaged += block([(b"\xff\xfe", b"v")])
            lengths.append(len(block([(b"\xff\xfe", b"v")])))
        python = verdict(records._check_header_blocks_py, bytes(damaged), lengths)
        c = verdict(records._check_header_blocks_c, bytes(damaged), lengths)
        assert (python is None) == (c is None), (python, c)
        if python is None:
            continue
        refused += 1
        assert python.startswith("malformed record header block: ")
        assert c is not None and c.startswith("malformed record header block: ")
        # The same kind of refusal; a mismatch (_header_block_mismatch) in the same words.
        mismatch = "declared, its headers take"
        assert (mismatch in python) == (mismatch in c), (python, c)
        if mismatch in python:
            assert c == python
    assert refused > 500  # the damage was mostly caught, by both


def test_check_body_uses_the_c_walk() -> None:
    assert records._check_header_blocks is records._check_header_blocks_c
