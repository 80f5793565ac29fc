"""How `tidelog consume` writes a record: the plain line (Kafka's console
consumer), a kcat-like format string (`-f`), or one JSON object per line.

Each writer is built once from the options and then called per record with
no parsing left to do, so printing costs little per record. Every writer
returns bytes (records are bytes; stdout is written in binary).

JSON (`--output json`): one object per line. A key, value or header value
that is UTF-8 is a JSON string with `"<field>_encoding": "utf8"`; one that is
not is base64 with `"base64"`; a null one is JSON null (encoding null), so
it is never confused with the string "null". JSON escapes newlines, so a
value with newlines stays on its line.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from tidelog.errors import InvalidRequestError
from tidelog.types import ConsumerRecord

Writer = Callable[[ConsumerRecord], bytes]

TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")

#: kcat's format tokens (`-f`), each to a function of the record.
_TOKENS: dict[str, Callable[[ConsumerRecord], bytes]] = {
    "t": lambda r: r.topic.encode(),
    "p": lambda r: b"%d" % r.partition,
    "o": lambda r: b"%d" % r.offset,
    "k": lambda r: r.key or b"",
    "s": lambda r: r.value or b"",
    "T": lambda r: b"%d" % r.timestamp,
    "h": lambda r: _headers_text(r, b"=", b","),
    "S": lambda r: b"%d" % (-1 if r.value is None else len(r.value)),
    "K": lambda r: b"%d" % (-1 if r.key is None else len(r.key)),
}
FORMAT_HELP = (
    "print each record with this format, as kcat's -f: %%t topic, %%p partition, %%o offset, "
    "%%k key, %%s value, %%T timestamp (ms), %%h headers (k=v,k=v), %%S value size, %%K key "
    "size (-1 when null), %%%% a %%; escapes \\n \\t \\r \\\\. No newline is added: end with \\n"
)


def format_writer(fmt: str) -> Writer:
    """A writer for a kcat format string (escapes already unescaped)."""
    parts: list[bytes | Callable[[ConsumerRecord], bytes]] = []
    literal = bytearray()
    i = 0
    while i < len(fmt):
        char = fmt[i]
        if char != "%":
            literal += char.encode()
            i += 1
            continue
        token = fmt[i + 1 : i + 2]
        if token == "%":
            literal += b"%"
        elif token in _TOKENS:
            if literal:
                parts.append(bytes(literal))
                literal.clear()
            parts.append(_TOKENS[token])
        else:
            raise InvalidRequestError(
                f"--format: unknown token %{token} at position {i} "
                f"(known: {', '.join('%' + t for t in _TOKENS)}, %%)"
            )
        i += 2
    if literal:
        parts.append(bytes(literal))

    def write(record: ConsumerRecord) -> bytes:
        return b"".join(p if isinstance(p, bytes) else p(record) for p in parts)

    return write


def _headers_text(record: ConsumerRecord, between: bytes, separator: bytes) -> bytes:
    return separator.join(
        key.encode() + between + (b"" if value is None else value) for key, value in record.headers
    )


def plain_writer(
    *,
    print_timestamp: bool,
    print_offset: bool,
    print_headers: bool,
    print_key: bool,
    null_marker: bytes = b"null",
) -> Writer:
    """Kafka's console consumer: [CreateTime:ts<TAB>][partition:offset<TAB>]
    [k:v,k:v or NO_HEADERS<TAB>][key<TAB>]value, one record per line."""

    def write(record: ConsumerRecord) -> bytes:
        out = []
        if print_timestamp:
            out.append(
                b"%s:%d\t" % (TIMESTAMP_TYPES[record.timestamp_type].encode(), record.timestamp)
            )
        if print_offset:
            out.append(b"%d:%d\t" % (record.partition, record.offset))
        if print_headers:
            out.append(
                (_headers_text(record, b":", b",") if record.headers else b"NO_HEADERS") + b"\t"
            )
        if print_key:
            out.append((null_marker if record.key is None else record.key) + b"\t")
        out.append(null_marker if record.value is None else record.value)
        out.append(b"\n")
        return b"".join(out)

    return write


def _field(out: dict[str, Any], name: str, data: bytes | None) -> None:
    if data is None:
        out[name] = None
        out[f"{name}_encoding"] = None
        return
    try:
        out[name] = data.decode("utf-8")
        out[f"{name}_encoding"] = "utf8"
    except UnicodeDecodeError:
        out[name] = base64.b64encode(data).decode("ascii")
        out[f"{name}_encoding"] = "base64"


def json_writer(record: ConsumerRecord) -> bytes:
    """One JSON object and a newline (see the module doc)."""
    out: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "timestamp_type": TIMESTAMP_TYPES[record.timestamp_type],
    }
    _field(out, "key", record.key)
    _field(out, "value", record.value)
    headers = []
    for key, value in record.headers:
        header: dict[str, Any] = {"key": key}
        _field(header, "value", value)
        headers.append(header)
    out["headers"] = headers
    return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
