"""Fixtures for gateway tests. The cluster and the gateway in front of it
are tests/conftest.py's (one per module); clients are given only the
gateway's address, and tests isolate themselves by topic and group names.
"""

from __future__ import annotations

import itertools

import pytest

_names = itertools.count()


@pytest.fixture
def names(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(topic, group) unique to the test."""
    n = next(_names)
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60].strip("-")
    return f"{base}-t{n}", f"{base}-g{n}"
