"""Fixtures any test directory can use, started only by a test that asks:
one real etcd, one cluster on it (a coordinator and three brokers) and one
gateway in front of it, each once per test module and stopped by PID after
it (tests/support/fixtures.py). Tests isolate themselves by topic, group or
key prefix. A directory or module that needs another shape (more brokers,
TLS, a fresh etcd per test) defines a fixture of the same name, which pytest
prefers.
"""

from __future__ import annotations

from tests.support.fixtures import service_fixtures

etcd, cluster, gateway = service_fixtures("module")
