"""docs/any-language.md, run as a reader would: every ```sh block of the page,
in order, with bash, the grpcurl that tools/go-tools.sh builds, and GATEWAY
set to a real cluster's gateway. Each must exit 0 and print what the ```json
(or ```text) block after it shows: the same JSON, except timestamps (the
clock's) and the order of consumed records across partitions and responses
(the gateway interleaves partitions as their data comes); a group stream's
events (assignment, commit answers) must come in the doc's order. So the page's
commands and answers cannot drift from what the gateway does."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.clients.conftest import REPO
from tests.support.gateway import GatewayProcess

# Generous: the first run on a machine builds grpcurl (minutes on 2 shared cores).
pytestmark = pytest.mark.timeout(900)

DOC = REPO / "docs" / "any-language.md"
COMMAND_TIMEOUT_S = 60
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass
class Example:
    command: str
    expected: str | None  # None: only the exit status is checked
    expected_kind: str  # "json" or "text"


def examples(text: str) -> list[Example]:
    """Each ```sh block with the ```json or ```text block right after it, if any."""
    blocks = [(m.group(1), m.group(2)) for m in _FENCE.finditer(text)]
    found = []
    for i, (kind, body) in enumerate(blocks):
        if kind != "sh":
            continue
        after = blocks[i + 1] if i + 1 < len(blocks) else ("", "")
        expected = after[1] if after[0] in ("json", "text") else None
        found.append(Example(body, expected, after[0]))
    return found


def json_stream(text: str) -> list[Any]:
    """grpcurl prints one JSON object per response, one after another."""
    decoder = json.JSONDecoder()
    objects, pos = [], 0
    text = text.strip()
    while pos < len(text):
        obj, end = decoder.raw_decode(text, pos)
        objects.append(obj)
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return objects


_CLOCK_FIELDS = {"timestamp_ms", "commit_time_ms"}


def normalized(objects: list[Any]) -> list[Any]:
    """Clock fields as "<ts>"; Consume responses merged into one, records in
    (partition, offset) order, followed by a group stream's events
    (assignment changes, commit answers) in the order they came."""

    def scrub(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: ("<ts>" if k in _CLOCK_FIELDS and v != "-1" else scrub(v))
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [scrub(v) for v in value]
        return value

    objects = scrub(objects)
    consume = {"records", "errors"}
    # How many answers a Consume stream sends depends on timing, so each
    # one's throttle time (0 here) is dropped with the merge.
    merged_away = {*consume, "throttle_time_ms"}
    if objects and all(isinstance(o, dict) and consume <= set(o) for o in objects):
        records = [r for o in objects for r in o["records"]]
        errors = [e for o in objects for e in o["errors"]]
        records.sort(key=lambda r: (r["topic"], r["partition"], int(r["offset"])))
        events = [{k: v for k, v in o.items() if k not in merged_away} for o in objects]
        return [{"records": records, "errors": errors}, *(e for e in events if e)]
    return objects


def test_the_doc_has_the_commands_it_promises() -> None:
    commands = [e.command for e in examples(DOC.read_text())]
    joined = "\n".join(commands)
    for call in ("Admin/CreateTopics", "Records/Produce", "Records/Consume", '"commit"'):
        assert call in joined, f"docs/any-language.md runs no {call}"
    assert all(e.expected is not None for e in examples(DOC.read_text()))


def test_every_command_of_the_doc_prints_what_the_doc_shows(
    gateway: GatewayProcess, grpcurl: Path
) -> None:
    env = {
        **os.environ,
        "GATEWAY": gateway.address,
        "PATH": f"{grpcurl.parent}{os.pathsep}{os.environ['PATH']}",
    }
    for n, example in enumerate(examples(DOC.read_text()), 1):
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", example.command],
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        where = f"docs/any-language.md, command {n}:\n{example.command}"
        assert result.returncode == 0, f"{where}\nfailed: {result.stderr}"
        if example.expected_kind == "json":
            got, want = (
                normalized(json_stream(result.stdout)),
                normalized(json_stream(example.expected or "")),
            )
        else:
            got, want = result.stdout.strip(), (example.expected or "").strip()
        assert got == want, f"{where}\nprinted:\n{result.stdout}"
