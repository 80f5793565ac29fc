"""Fault tests: `soak` tests run only when chosen (`pytest -m soak`)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "soak" in (config.getoption("markexpr") or ""):
        return
    kept, deselected = [], []
    for item in items:
        (deselected if item.get_closest_marker("soak") else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
