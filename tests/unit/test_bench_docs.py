"""docs/benchmarks.md is rendered by `python -m bench --docs` (bench/__main__.py): its
hand-written "What bounds Tidelog" section comes from `bench.__main__.BOUNDS`. An edit made to
the page alone is lost at the next render, and one made to BOUNDS alone is not read until then:
the two must hold the same text."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.__main__ import BOUNDS

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(30)


def test_the_page_holds_what_bounds_tidelog_as_the_renderer_writes_it() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert BOUNDS.strip() in page, (
        "docs/benchmarks.md and bench/__main__.py's BOUNDS differ: make the same edit to both"
    )
