"""The chart passes `helm lint --strict`, renders with the default and the
production values, every manifest is valid against Kubernetes' own API
schemas (kubernetes-validate, offline), the values schema refuses what the
chart cannot deploy, and NOTES.txt says how to connect."""

from __future__ import annotations

import shutil
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import CHART, NAMESPACE, Chart, HelmError
from tests.deploy.conftest import HELM_BUILD_TIMEOUT_S

# One worker runs every chart test: only it waits for a first build of helm.
pytestmark = [pytest.mark.timeout(HELM_BUILD_TIMEOUT_S + 300), pytest.mark.xdist_group("helm")]

PRODUCTION = str(CHART / "values-production.yaml")
#: The oldest Kubernetes the chart supports and the newest the package knows.
KUBE_VERSIONS = ["1.27.0", "1.37.0"]


@pytest.mark.parametrize("values", [[], ["-f", PRODUCTION]], ids=["default", "production"])
def test_helm_lint_strict_passes(chart: Chart, values: list[str]) -> None:
    out = chart.run("lint", "--strict", str(CHART), *values)
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize(
    "values",
    [
        [],
        ["-f", PRODUCTION],
        ["--set", "etcd.enabled=false", "--set", "etcd.externalEndpoints={e:2379}"],
    ],
    ids=["default", "production", "external-etcd"],
)
def test_every_rendered_manifest_is_valid_for_kubernetes(
    chart: Chart, kube_version: str, values: list[str]
) -> None:
    rendered = chart.render(*values, kube_version=kube_version)
    assert len(rendered.manifests) >= 10
    for manifest in rendered.manifests:
        # strict: a field Kubernetes does not know is an error, not ignored.
        kubernetes_validate.validate(manifest, kube_version, strict=True)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "coordinator.replicas=1"], "/coordinator/replicas"),
        (["--set", "etcd.replicas=2"], "/etcd/replicas"),
        (["--set", "broker.antiAffinity=maybe"], "/broker/antiAffinity"),
        (["--set", "broker.replicas=0"], "/broker/replicas"),
        (["--set", "etcd.enabled=false"], "/etcd/externalEndpoints"),
        (
            ["--set", "etcd.enabled=false", "--set", "etcd.externalEndpoints={nohost}"],
            "externalEndpoints",
        ),
        (["--set", "brokers.replicas=3"], "brokers"),
        (["--set", "gateway.service.type=Ingress"], "/gateway/service/type"),
    ],
)
def test_the_values_schema_refuses_what_the_chart_cannot_deploy(
    chart: Chart, values: list[str], message: str
) -> None:
    with pytest.raises(HelmError, match=message):
        chart.render(*values)


def test_notes_say_how_to_reach_the_gateway(chart: Chart, tmp_path: Path) -> None:
    """helm template does not render NOTES.txt (and `helm install --dry-run`
    needs a cluster): render it through `tpl` in a copy of the chart."""
    copy = tmp_path / "tidelog"
    shutil.copytree(CHART, copy)
    shutil.copy(copy / "templates" / "NOTES.txt", copy / "notes-source.txt")
    (copy / "templates" / "notes-render.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
        '  notes: {{ tpl (.Files.Get "notes-source.txt") . | toYaml | indent 4 }}\n'
    )
    out = Chart(chart.helm, copy).run(
        "template", "rel", str(copy), "--namespace", NAMESPACE,
        "--show-only", "templates/notes-render.yaml",
    )  # fmt: skip
    notes = yaml.safe_load(out)["data"]["notes"]
    assert f"rel-tidelog-gateway.{NAMESPACE}.svc.cluster.local:9400" in notes
    assert "port-forward svc/rel-tidelog-gateway 9400:9400" in notes
    assert "TIDELOG_BOOTSTRAP=127.0.0.1:9400" in notes
