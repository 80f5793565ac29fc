"""Fixtures any test directory can use, started only by a test that asks:
one real etcd, one cluster on it (a coordinator and three brokers) and one
gateway in front of it, each once per test module and stopped by PID after
it (tests/support/fixtures.py). Tests isolate themselves by topic, group or
key prefix. A directory or module that needs another shape (more brokers,
TLS, a fresh etcd per test) defines a fixture of the same name, which pytest
prefers.

Under `--dist loadgroup` (make test) the tests of a module that use one of
its module-scoped fixtures run in one xdist worker (tests/support/xdist_groups.py),
so that the module's cluster starts once, not once per worker.
"""

from __future__ import annotations

import pytest

from tests.support.fixtures import service_fixtures
from tests.support.xdist_groups import check_group_reached_xdist, group_by_module_fixtures

etcd, cluster, gateway = service_fixtures("module")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # tryfirst: before pytest-xdist reads the marks (its hook is a plain one);
    # the directories' own hooks that mark a whole directory (tests/spark,
    # tests/integration/clients) are tryfirst too and, registered later, run first.
    group_by_module_fixtures(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    check_group_reached_xdist(item)
