"""The Go example's record-batch encoder (examples/go/batch.go), written from
docs/record-batch.md alone, against the Python SDK's (`tidelog.records`, the
reference): for the same records with fixed timestamps, the same bytes. The
document is the contract; a difference means one of the two, or the page,
is wrong. (That a broker accepts the Go batches is shown by
test_examples.py's `-api log` run.)"""

from __future__ import annotations

import base64
import json
import random
import subprocess
from typing import Any

import pytest
from tidelog.records import decode_batches, encode_batch

from tests.integration.clients.conftest import build

# Generous: the first run on a machine builds the tools and the example (minutes).
pytestmark = pytest.mark.timeout(900)

Record = dict[str, Any]  # key, value: bytes | None; headers: [(str, bytes | None)]; timestamp_ms


def record(
    key: bytes | None,
    value: bytes | None,
    timestamp_ms: int,
    headers: list[tuple[str, bytes | None]] | None = None,
) -> Record:
    return {"key": key, "value": value, "timestamp_ms": timestamp_ms, "headers": headers or []}


def random_batch(rng: random.Random, count: int) -> list[Record]:
    def some_bytes(most: int) -> bytes | None:
        return None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, most))

    return [
        record(
            some_bytes(16),
            some_bytes(200),
            1_700_000_000_000 + rng.randint(-5_000, 5_000),
            [(f"h{j}-é", some_bytes(8)) for j in range(rng.randint(0, 3))],
        )
        for _ in range(count)
    ]


BATCHES: dict[str, list[Record]] = {
    "one record": [record(b"k", b"v", 1_700_000_000_000)],
    "null key, null value, empty value": [
        record(None, b"v", 1_700_000_000_000),
        record(b"k", None, 1_700_000_000_001),
        record(b"", b"", 1_700_000_000_002),
    ],
    "headers, some records without": [
        record(b"a", b"1", 1_700_000_000_000, [("trace", b"t1"), ("clé", b"\x00\xff")]),
        record(b"b", b"2", 1_700_000_000_000),
        record(b"c", b"3", 1_700_000_000_000, [("null", None), ("", b"")]),
    ],
    "timestamps out of order": [
        record(b"a", b"1", 1_700_000_000_500),
        record(b"b", b"2", 1_700_000_000_900),
        record(b"c", b"3", 1_700_000_000_100),
    ],
    "1000 random records": random_batch(random.Random(10), 1000),
}


def python_batch(records: list[Record]) -> bytes:
    any_headers = any(r["headers"] for r in records)
    return encode_batch(
        [r["value"] for r in records],
        keys=[r["key"] for r in records],
        timestamps=[r["timestamp_ms"] for r in records],
        headers=[r["headers"] for r in records] if any_headers else None,
    )


def as_json(records: list[Record]) -> list[dict[str, Any]]:
    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode()

    return [
        {
            "key": b64(r["key"]),
            "value": b64(r["value"]),
            "timestamp_ms": r["timestamp_ms"],
            "headers": [{"key": k, "value": b64(v)} for k, v in r["headers"]],
        }
        for r in records
    ]


def test_go_batches_are_byte_identical_to_the_python_encoders() -> None:
    binary = build("examples/go/build.sh")
    names = list(BATCHES)
    request = json.dumps({"batches": [as_json(BATCHES[name]) for name in names]})
    result = subprocess.run(
        [str(binary), "encode"],
        input=request.encode(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    go_bytes = result.stdout

    # Split the Go output with the Python decoder, so that a difference names its batch.
    go_batches = list(decode_batches(go_bytes))
    assert len(go_batches) == len(names)
    pos = 0
    for name, decoded in zip(names, go_batches, strict=True):
        size = decoded.header.batch_length + 12
        expected = python_batch(BATCHES[name])
        assert go_bytes[pos : pos + size] == expected, f"batch {name!r} differs"
        assert decoded.keys == [r["key"] for r in BATCHES[name]]
        pos += size
    assert pos == len(go_bytes)
