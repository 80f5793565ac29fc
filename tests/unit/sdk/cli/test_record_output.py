"""How `tidelog consume` prints a record: kcat's -f tokens, JSON lines, the plain line."""

from __future__ import annotations

import base64
import json

import pytest
from tidelog.cli._common import unescape
from tidelog.cli._record_output import format_writer, json_writer, plain_writer
from tidelog.errors import InvalidRequestError
from tidelog.types import ConsumerRecord


def record(
    key: bytes | None = b"k1",
    value: bytes | None = b"v1",
    headers: list[tuple[str, bytes | None]] | None = None,
) -> ConsumerRecord:
    return ConsumerRecord("t", 2, 17, 1_700_000_000_123, 0, key, value, headers or [])


def test_every_kcat_token_and_escape() -> None:
    write = format_writer(unescape(r"%t|%p|%o|%k|%s|%T|%h|%S|%K|100%%\t\n"))
    out = write(record(headers=[("a", b"1"), ("b", None)]))
    assert out == b"t|2|17|k1|v1|1700000000123|a=1,b=|2|2|100%\t\n"


def test_null_key_and_value_are_empty_with_size_minus_one() -> None:
    write = format_writer("[%k][%s] %K %S")
    assert write(record(key=None, value=None)) == b"[][] -1 -1"


def test_an_unknown_token_names_itself() -> None:
    with pytest.raises(InvalidRequestError, match="%x"):
        format_writer("%s %x")


def test_json_line_keeps_null_apart_from_the_string_null() -> None:
    null = json.loads(json_writer(record(key=None, value=None)))
    text = json.loads(json_writer(record(key=b"null", value=b"null")))
    assert null["key"] is None and null["value"] is None and null["value_encoding"] is None
    assert text["key"] == "null" and text["value"] == "null" and text["value_encoding"] == "utf8"


def test_json_values_that_are_not_utf8_are_base64_with_a_marker() -> None:
    raw = b"\xff\x00\xfe"
    line = json.loads(json_writer(record(value=raw, headers=[("h", raw)])))
    assert line["value_encoding"] == "base64"
    assert base64.b64decode(line["value"]) == raw
    assert line["headers"] == [
        {"key": "h", "value": base64.b64encode(raw).decode(), "value_encoding": "base64"}
    ]


def test_json_newlines_in_values_stay_on_one_line() -> None:
    out = json_writer(record(value=b"two\nlines\r\n", key="ключ".encode()))
    assert out.count(b"\n") == 1 and out.endswith(b"\n")
    line = json.loads(out)
    assert line["value"] == "two\nlines\r\n" and line["key"] == "ключ"
    assert line["topic"] == "t" and line["partition"] == 2 and line["offset"] == 17
    assert line["timestamp"] == 1_700_000_000_123 and line["timestamp_type"] == "CreateTime"


def test_the_plain_line_is_kafka_console_consumers() -> None:
    write = plain_writer(
        print_timestamp=True, print_offset=True, print_headers=True, print_key=True
    )
    assert write(record(headers=[("a", b"1")])) == b"CreateTime:1700000000123\t2:17\ta:1\tk1\tv1\n"
    assert write(record(key=None)) == b"CreateTime:1700000000123\t2:17\tNO_HEADERS\tnull\tv1\n"
    bare = plain_writer(
        print_timestamp=False, print_offset=False, print_headers=False, print_key=False
    )
    assert bare(record(value=None)) == b"null\n"
