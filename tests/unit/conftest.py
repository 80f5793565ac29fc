"""Fixtures for unit tests that need etcd (the server core's and the
coordinator's): one real etcd per module, started only by a test that asks
for it, and a fresh key prefix per test (tests isolate themselves by
prefix); tests that restart etcd start their own."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.support.etcd import EtcdProcess

_prefixes = itertools.count()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    process = EtcdProcess.start(tmp_path_factory.mktemp("etcd"))
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def prefix() -> bytes:
    return f"/u{next(_prefixes)}/".encode()
