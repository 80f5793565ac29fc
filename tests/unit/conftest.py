"""Fixtures for unit tests that need etcd (the server core's and the
coordinator's): one real etcd per module, started only by a test that asks
for it, and a fresh key prefix per test (tests isolate themselves by
prefix); tests that restart etcd start their own."""

from __future__ import annotations

import itertools

import pytest

_prefixes = itertools.count()


@pytest.fixture
def prefix() -> bytes:
    return f"/u{next(_prefixes)}/".encode()
