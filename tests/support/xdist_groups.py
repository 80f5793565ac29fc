"""Which xdist worker runs a test: the tests of one module that share a
module-scoped fixture (a cluster, a broker, an etcd) run in one worker.

`--dist loadgroup` hands out every test without an `xdist_group` mark on its
own, to whichever worker is free: the tests of one module then land in every
worker, and each worker starts the module's fixtures for itself (and again
whenever it comes back to the module after another one). Marking those tests
`xdist_group("<module path>")` sends them to one worker as one unit, which
starts the fixtures once. Tests of the module that use no module-scoped
fixture stay free to spread; a test already in a group keeps it.
"""

from __future__ import annotations

import pytest


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in info.names_closure:
        definitions = info.name2fixturedefs.get(name)
        # The last definition is the one the test gets (the closest override).
        if definitions and definitions[-1].scope == "module":
            return True
    return False


def group_by_module_fixtures(items: list[pytest.Item]) -> None:
    """Mark the tests that use a module-scoped fixture with their module's group."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        if _uses_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def check_group_reached_xdist(item: pytest.Item) -> None:
    """In an xdist worker under `--dist loadgroup`: fail a test marked
    xdist_group whose group did not get into its node id (what
    pytest-xdist's scheduler reads), as happened silently with pytest 9.2
    (pytest-xdist issue 1386): the group's tests then ran in every worker,
    each starting the group's shared resource (Spark, a cluster) for itself."""
    # Set by pytest-xdist in its workers only.
    if not getattr(item.config.option, "loadgroup", False):
        return
    if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid:
        pytest.fail(
            "--dist loadgroup: this test is marked xdist_group but its group did not reach "
            "pytest-xdist (no @group in its node id): this pytest-xdist does not work with "
            "this pytest; see the pytest pin in requirements-dev.txt",
            pytrace=False,
        )
