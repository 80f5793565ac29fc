"""How `tidelog produce` turns a line of stdin into a record, with the
properties of Kafka's console producer (`--property k=v`):

    [headers<headers.delimiter>][timestamp<timestamp.separator>][key<key.separator>]value

- `parse.headers=true`: the line starts with headers, `k:v` pairs
  (`headers.key.separator`, default ":") separated by `headers.separator`
  (default ","), ended by `headers.delimiter` (default TAB);
- `parse.timestamp=true` (Tidelog's, Kafka's console producer has none): then
  the record's timestamp in ms since the epoch, ended by `timestamp.separator`
  (default TAB);
- `parse.key=true`: then the key, ended by `key.separator` (default TAB);
- `null.marker=S`: a key, value or header value equal to S is sent as null
  (a value of null is a tombstone, what compaction deletes a key with);
- `ignore.error=true`: a line without the key separator is sent without a
  key (else it is an error).

Separators take the escapes \\t \\n \\r \\\\. A line that lacks a separator
it must have is an error naming the line and the separator.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidelog.cli._common import unescape
from tidelog.errors import InvalidRequestError
from tidelog.records import Header

#: The properties understood, with their defaults (Kafka's).
DEFAULTS = {
    "parse.key": "false",
    "key.separator": "\t",
    "parse.headers": "false",
    "headers.delimiter": "\t",
    "headers.separator": ",",
    "headers.key.separator": ":",
    "parse.timestamp": "false",
    "timestamp.separator": "\t",
    "null.marker": "",
    "ignore.error": "false",
}


def _show(data: bytes) -> str:
    """A piece of a line for an error message: short, quoted, readable."""
    return repr(data[:60].decode("utf-8", errors="replace"))


@dataclass(frozen=True)
class ParsedLine:
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    timestamp_ms: int | None


class LineReader:
    """Parses lines with the properties given (see the module doc)."""

    def __init__(self, properties: dict[str, str]) -> None:
        unknown = sorted(set(properties) - set(DEFAULTS))
        if unknown:
            raise InvalidRequestError(
                f"--property: unknown {', '.join(unknown)} (known: {', '.join(sorted(DEFAULTS))})"
            )
        merged = {**DEFAULTS, **properties}
        for name in ("parse.key", "parse.headers", "parse.timestamp", "ignore.error"):
            if merged[name].lower() not in ("true", "false"):
                raise InvalidRequestError(f"--property {name}={merged[name]!r}: true or false")
        self.parse_key = merged["parse.key"].lower() == "true"
        self.parse_headers = merged["parse.headers"].lower() == "true"
        self.parse_timestamp = merged["parse.timestamp"].lower() == "true"
        self.ignore_error = merged["ignore.error"].lower() == "true"
        separators = {}
        for name in (
            "key.separator",
            "headers.delimiter",
            "headers.separator",
            "headers.key.separator",
            "timestamp.separator",
        ):
            separator = unescape(merged[name]).encode()
            if not separator:
                raise InvalidRequestError(f"--property {name} must not be empty")
            separators[name] = separator
        self._key_separator = separators["key.separator"]
        self._headers_delimiter = separators["headers.delimiter"]
        self._headers_separator = separators["headers.separator"]
        self._header_key_separator = separators["headers.key.separator"]
        self._timestamp_separator = separators["timestamp.separator"]
        marker = unescape(merged["null.marker"]).encode()
        self._null_marker: bytes | None = marker or None

    def parse(self, line: bytes, number: int) -> ParsedLine:
        """One line (without its newline); raises InvalidRequestError."""
        rest = line
        headers: list[Header] = []
        timestamp_ms = None
        key = None
        if self.parse_headers:
            text, rest = self._split(rest, self._headers_delimiter, "headers.delimiter", number)
            headers = self._headers(text, number)
        if self.parse_timestamp:
            text, rest = self._split(rest, self._timestamp_separator, "timestamp.separator", number)
            try:
                timestamp_ms = int(text)
            except ValueError:
                raise InvalidRequestError(
                    f"line {number}: timestamp {_show(text)} is not an integer (ms since the epoch)"
                ) from None
        if self.parse_key:
            key_text, found, value = rest.partition(self._key_separator)
            if found:
                key, rest = self._nullable(key_text), value
            elif not self.ignore_error:
                raise InvalidRequestError(
                    f"line {number}: no key.separator ({self._key_separator.decode()!r}) in "
                    f"{_show(rest)} (ignore.error=true sends such a line without a key)"
                )
        return ParsedLine(key, self._nullable(rest), headers, timestamp_ms)

    def _nullable(self, data: bytes) -> bytes | None:
        return None if self._null_marker is not None and data == self._null_marker else data

    def _split(self, data: bytes, separator: bytes, name: str, number: int) -> tuple[bytes, bytes]:
        head, found, tail = data.partition(separator)
        if not found:
            raise InvalidRequestError(
                f"line {number}: no {name} ({separator.decode()!r}) in {_show(data)}"
            )
        return head, tail

    def _headers(self, text: bytes, number: int) -> list[Header]:
        if not text:
            return []
        headers: list[Header] = []
        for pair in text.split(self._headers_separator):
            name, found, value = pair.partition(self._header_key_separator)
            if not found:
                raise InvalidRequestError(
                    f"line {number}: header {_show(pair)} has no headers.key.separator "
                    f"({self._header_key_separator.decode()!r})"
                )
            try:
                header_key = name.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidRequestError(
                    f"line {number}: header key {_show(name)} is not UTF-8"
                ) from None
            headers.append((header_key, self._nullable(value)))
        return headers
