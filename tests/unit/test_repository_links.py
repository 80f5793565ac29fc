"""The repository is self-contained: every relative link in its Markdown
files points at a file inside it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(10)

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"`((?:\.\./|docs/|\./)[^`\s]+\.md)`|\]\(((?!https?:|#)[^)\s]+)\)")


@pytest.mark.parametrize(
    "page", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))]
)
def test_relative_links_stay_inside_the_repository(page: str) -> None:
    path = ROOT / page if page == "README.md" else ROOT / "docs" / page
    for match in LINK.finditer(path.read_text()):
        target = (match.group(1) or match.group(2)).split("#")[0]
        base = ROOT if match.group(1) else path.parent
        resolved = (base / target).resolve()
        assert resolved.is_relative_to(ROOT), f"{page} links {target}, outside the repository"
        assert resolved.exists(), f"{page} links {target}, which does not exist"
