"""Fixtures for the Helm chart's checks (deploy/k8s/tidelog): the `helm`
binary that tools/helm.sh builds from the Go module proxy and caches in
~/.cache/tidelog/go-bin, and the chart rendered with the default and the
production values.

The first build of helm takes ~10 minutes on a 2-core machine. `make test`
starts it in the background before lint and the other tests
(`make helm-background`); the fixture then waits for it (tools/helm.sh
holds a lock while building) with a generous deadline, so the build overlaps
the rest of the suite instead of adding to it; the chart tests share one
xdist worker (`xdist_group("helm")`), so only that worker waits. Without Go
the tests are skipped with that reason; a build that fails fails them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.deploy.chart import CHART, Chart, Rendered

REPO = Path(__file__).resolve().parents[2]
#: Waiting for a first build that another process started (or starting it).
HELM_BUILD_TIMEOUT_S = 30 * 60
TOOL_MISSING = 3


@pytest.fixture(scope="session")
def helm() -> Path:
    result = subprocess.run(
        [str(REPO / "tools" / "helm.sh")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HELM_BUILD_TIMEOUT_S,
        check=False,
    )
    if result.returncode == TOOL_MISSING:
        pytest.skip(f"tools/helm.sh: {result.stderr.strip()}")
    if result.returncode != 0:
        pytest.fail(f"tools/helm.sh failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def chart(helm: Path) -> Chart:
    return Chart(helm, CHART)


@pytest.fixture(scope="session")
def default_render(chart: Chart) -> Rendered:
    return chart.render()


@pytest.fixture(scope="session")
def production_render(chart: Chart) -> Rendered:
    return chart.render("-f", str(CHART / "values-production.yaml"))


@pytest.fixture(scope="session", params=["default", "production"])
def rendered(request: pytest.FixtureRequest) -> Rendered:
    """Each test that takes this runs on both renders."""
    return request.getfixturevalue(f"{request.param}_render")
