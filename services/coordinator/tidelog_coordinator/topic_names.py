"""Topic-name validation on the commit path, remembering the names found valid.

Every entry of every offset commit names a topic, and the coordinator checks
that name twice per entry (the request's limits, then the offset store), each
time with tidelog.names' rule (a regular expression). A group commits the
same few names over and over, so the names found valid are remembered and a
remembered name is accepted by one set lookup. Only valid names are
remembered: an invalid one goes through the rule every time and is refused
with the rule's own error, so the cache changes no outcome and no message.

The memory is bounded (VALID_TOPIC_NAMES_MAX names, each at most 249
characters): when it is full it is emptied and fills again with the names in
use, so a client sending ever new names costs what it cost without the
cache, plus one set insertion per name. One event loop; not thread-safe
(a lost insertion would only mean one more check).
"""

from __future__ import annotations

from tidelog.names import validate_topic_name

#: Valid names remembered at most: a cluster's topics in use by commits
#: fit (the coordinator serves groups of up to thousands of topics), and
#: the memory stays bounded (4,096 x 249 characters: ~1 MiB at worst).
VALID_TOPIC_NAMES_MAX = 4096


class TopicNameCache:
    """`validate(name)` is tidelog.names.validate_topic_name, remembering
    up to `max_names` valid names (see the module doc)."""

    def __init__(self, max_names: int = VALID_TOPIC_NAMES_MAX) -> None:
        if max_names < 1:
            raise ValueError(f"max_names must be at least 1, not {max_names}")
        self.max_names = max_names
        self._valid: set[str] = set()

    def __len__(self) -> int:
        return len(self._valid)

    def validate(self, name: str) -> str:
        """Return `name` if it is a legal topic name, else raise
        InvalidTopicError (the rule's own message)."""
        if name in self._valid:
            return name
        validate_topic_name(name)
        valid = self._valid
        if len(valid) >= self.max_names:
            valid.clear()
        valid.add(name)
        return name


#: The coordinator's one cache (both checks of a commit use it).
validate_topic_name_cached = TopicNameCache().validate
