"""Durable topic metadata of a single broker: `<data-dir>/topics.json`.

While Tidelog runs as one broker, the broker itself remembers which topics
exist, how many partitions each has and its config overrides. (The
coordinator takes this over on etcd; the broker then learns topics by watch.)

Format: a JSON object `{"version": 1, "topics": {name: {"partitions": N,
"configs": {key: value}, "topic_id": ID}}}` (no `topic_id` for a topic
created before ids were kept), replaced durably on every change
(`tidelog_server.atomic_files`) so that a crash leaves either the old or the
new file, never a torn one. Not thread-safe.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tidelog.errors import StorageError
from tidelog_server.atomic_files import write_atomically

_FILE_NAME = "topics.json"
_FORMAT_VERSION = 1


@dataclass(frozen=True)
class TopicSpec:
    """What defines a topic: its partition count and its config overrides,
    and the id of this incarnation of it ("" for a topic created before
    ids were kept: its logs' directories then record none)."""

    name: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    topic_id: str = ""


class TopicStore:
    """Reads and writes the topic metadata file of one data directory."""

    def __init__(self, data_dir: Path) -> None:
        self._path = data_dir / _FILE_NAME

    def load(self) -> dict[str, TopicSpec]:
        """All topics on disk (empty when the file does not exist yet)."""
        try:
            raw = json.loads(self._path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise StorageError(f"cannot read topic metadata {self._path}: {exc}") from exc
        if raw.get("version") != _FORMAT_VERSION:
            raise StorageError(f"{self._path}: unsupported format version {raw.get('version')!r}")
        return {
            name: TopicSpec(
                name,
                int(spec["partitions"]),
                dict(spec.get("configs", {})),
                str(spec.get("topic_id", "")),
            )
            for name, spec in raw["topics"].items()
        }

    def save(self, topics: dict[str, TopicSpec]) -> None:
        """Replace the file with `topics`, atomically."""
        body = {
            "version": _FORMAT_VERSION,
            "topics": {
                spec.name: {
                    "partitions": spec.partitions,
                    "configs": spec.configs,
                    **({"topic_id": spec.topic_id} if spec.topic_id else {}),
                }
                for spec in sorted(topics.values(), key=lambda s: s.name)
            },
        }
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self._path, json.dumps(body, indent=2).encode("utf-8"))
        except OSError as exc:
            raise StorageError(f"cannot write topic metadata {self._path}: {exc}") from exc
