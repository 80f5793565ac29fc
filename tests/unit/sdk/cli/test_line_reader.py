"""How `tidelog produce` parses a line, with Kafka's console producer properties."""

from __future__ import annotations

import pytest
from tidelog.cli._line_reader import LineReader
from tidelog.errors import InvalidRequestError


def test_headers_timestamp_key_and_value() -> None:
    reader = LineReader({"parse.headers": "true", "parse.timestamp": "true", "parse.key": "true"})
    parsed = reader.parse(b"a:1,b:two\t1700000000000\tkey\tthe value", 1)
    assert parsed.headers == [("a", b"1"), ("b", b"two")]
    assert parsed.timestamp_ms == 1_700_000_000_000
    assert (parsed.key, parsed.value) == (b"key", b"the value")


def test_separators_are_configurable_and_take_escapes() -> None:
    reader = LineReader(
        {
            "parse.headers": "true",
            "headers.delimiter": "|",
            "headers.separator": ";",
            "headers.key.separator": "=",
            "parse.key": "true",
            "key.separator": r"\t",
        }
    )
    parsed = reader.parse(b"a=1;b=2|k\tv", 1)
    assert parsed.headers == [("a", b"1"), ("b", b"2")]
    assert (parsed.key, parsed.value) == (b"k", b"v")
    assert reader.parse(b"|k\tv", 2).headers == []  # no headers on this line


def test_the_null_marker_makes_tombstones_and_null_keys_and_header_values() -> None:
    reader = LineReader(
        {"parse.key": "true", "key.separator": ":", "null.marker": "NULL", "parse.headers": "true"}
    )
    parsed = reader.parse(b"h:NULL\tk:NULL", 1)
    assert parsed.value is None and parsed.key == b"k" and parsed.headers == [("h", None)]
    assert reader.parse(b"\tNULL:v", 2).key is None
    # Without a marker, "NULL" is just text.
    assert LineReader({}).parse(b"NULL", 1).value == b"NULL"


def test_a_missing_separator_names_the_line() -> None:
    reader = LineReader({"parse.key": "true"})
    with pytest.raises(InvalidRequestError, match=r"line 7: no key\.separator"):
        reader.parse(b"no tab here", 7)
    lenient = LineReader({"parse.key": "true", "ignore.error": "true"})
    parsed = lenient.parse(b"no tab here", 7)
    assert parsed.key is None and parsed.value == b"no tab here"
    with pytest.raises(InvalidRequestError, match=r"line 3: no headers\.delimiter"):
        LineReader({"parse.headers": "true"}).parse(b"x", 3)
    with pytest.raises(InvalidRequestError, match="line 4: timestamp 'soon'"):
        LineReader({"parse.timestamp": "true"}).parse(b"soon\tx", 4)


def test_unknown_properties_and_bad_booleans_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match=r"parse\.keys"):
        LineReader({"parse.keys": "true"})
    with pytest.raises(InvalidRequestError, match="true or false"):
        LineReader({"parse.key": "yes"})
