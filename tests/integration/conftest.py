"""Shared fixtures for integration tests: a real broker process per module.

`broker` starts `python -m tidelog_broker --auto-create-topics` on a free
loopback port with a temp data dir (tests/support/processes.py), waits for
its health check to answer SERVING, yields the BrokerProcess (use
`.address`), and stops it by PID afterwards. One broker per test module keeps
the suite fast; tests isolate themselves with unique topic names
(`topic_name`). `own_broker` is a broker of one test alone, for tests
that kill, restart or freeze it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import BrokerProcess, start_broker

_topic_ids = itertools.count()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir: Path = tmp_path_factory.mktemp("broker") / "data"
    process = start_broker(data_dir)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker of this test alone: it may kill, restart or freeze it."""
    process = start_broker(tmp_path / "data")
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def broker_address(broker: BrokerProcess) -> str:
    return broker.address


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test (valid: [a-zA-Z0-9._-])."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:80].strip("-")
    return f"{base}-{next(_topic_ids)}"
