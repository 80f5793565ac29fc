"""The naming rule for topics, enforced by the coordinator and the brokers.

The client checks it too, before it sends anything, so that a bad name fails
at once (InvalidTopicError) instead of waiting for metadata that cannot come;
the services import it from here, so there is one rule.

Kafka's rule: 1 to 249 characters from [a-zA-Z0-9._-], and not "." or "..".
The limit of 249 leaves room for the partition suffix in the log directory
name (`<topic>-<partition>`) within a 255-byte file name.
"""

from __future__ import annotations

import re

from tidelog.errors import InvalidTopicError

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def validate_topic_name(name: str) -> str:
    """Return `name` if it is a legal topic name, else raise InvalidTopicError."""
    if not name:
        raise InvalidTopicError("topic name is empty: use 1 to 249 characters from [a-zA-Z0-9._-]")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name {name!r} is not allowed")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(
            f"topic name is {len(name)} characters long: "
            f"at most {MAX_TOPIC_NAME_LENGTH} are allowed"
        )
    if not _LEGAL.fullmatch(name):
        bad = sorted({c for c in name if not _LEGAL.fullmatch(c)})
        raise InvalidTopicError(
            f"topic name {name!r} contains {''.join(bad)!r}: "
            "only letters, digits, '.', '_' and '-' are allowed"
        )
    return name
