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
#: Every optional part on: TLS, the ServiceMonitor and the Grafana dashboard.
EVERYTHING_ON = [
    "--set", "tls.enabled=true", "--set", "tls.existingSecret=tidelog-tls",
    "--set", "tls.clientAuth=require", "--set", "metrics.serviceMonitor.enabled=true",
    "--set", "metrics.grafanaDashboard.enabled=true",
]  # fmt: skip
#: Kinds defined by CustomResourceDefinitions, which kubernetes-validate does
#: not know (it ships only Kubernetes' own API schemas): skipped, by name, so
#: that any other unknown kind still fails. The ServiceMonitor's own fields
#: are checked in test_chart_promises.
CUSTOM_RESOURCES = {("monitoring.coreos.com/v1", "ServiceMonitor")}
#: The oldest Kubernetes the chart supports and the newest the package knows.
KUBE_VERSIONS = ["1.27.0", "1.37.0"]


@pytest.mark.parametrize(
    "values",
    [[], ["-f", PRODUCTION], EVERYTHING_ON],
    ids=["default", "production", "tls-and-monitoring"],
)
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
        EVERYTHING_ON,
        ["--set", "metrics.enabled=false"],
    ],
    ids=["default", "production", "external-etcd", "tls-and-monitoring", "no-metrics"],
)
def test_every_rendered_manifest_is_valid_for_kubernetes(
    chart: Chart, kube_version: str, values: list[str]
) -> None:
    rendered = chart.render(*values, kube_version=kube_version)
    assert len(rendered.manifests) >= 10
    for manifest in rendered.manifests:
        if (manifest["apiVersion"], manifest["kind"]) in CUSTOM_RESOURCES:
            continue
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
        (["--set", "tls.enabled=true"], "/tls/existingSecret"),
        (["--set", "tls.existingSecret=s", "--set", "tls.enabled=yes"], "/tls/enabled"),
        (["--set", "tls.clientAuth=optional"], "/tls/clientAuth"),
        (["--set", "tls.secret=s"], "tls"),
        (["--set", "metrics.port=0"], "/metrics/port"),
        (
            ["--set", "metrics.enabled=false", "--set", "metrics.serviceMonitor.enabled=true"],
            "/metrics/serviceMonitor/enabled",
        ),
        (["--set", "metrics.serviceMonitor.interval=soon"], "/metrics/serviceMonitor/interval"),
    ],
)
def test_the_values_schema_refuses_what_the_chart_cannot_deploy(
    chart: Chart, values: list[str], message: str
) -> None:
    with pytest.raises(HelmError, match=message):
        chart.render(*values)


def test_notes_say_how_to_reach_the_gateway_with_and_without_tls(
    chart: Chart, tmp_path: Path
) -> None:
    """helm template does not render NOTES.txt (and `helm install --dry-run`
    needs a cluster): render it through `tpl` in a copy of the chart."""
    copy = tmp_path / "tidelog"
    shutil.copytree(CHART, copy)
    shutil.copy(copy / "templates" / "NOTES.txt", copy / "notes-source.txt")
    (copy / "templates" / "notes-render.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
        '  notes: {{ tpl (.Files.Get "notes-source.txt") . | toYaml | indent 4 }}\n'
    )

    def notes(*values: str) -> str:
        out = Chart(chart.helm, copy).run(
            "template", "rel", str(copy), "--namespace", NAMESPACE,
            "--show-only", "templates/notes-render.yaml", *values,
        )  # fmt: skip
        return str(yaml.safe_load(out)["data"]["notes"])

    plain = notes()
    assert f"rel-tidelog-gateway.{NAMESPACE}.svc.cluster.local:9400" in plain
    assert "port-forward svc/rel-tidelog-gateway 9400:9400" in plain
    assert "TIDELOG_BOOTSTRAP=127.0.0.1:9400" in plain
    assert "SSL" not in plain
    tls = notes("--set", "tls.enabled=true", "--set", "tls.existingSecret=tidelog-tls")
    # A certificate names the gateway, not 127.0.0.1: the client must dial the name.
    assert "TIDELOG_BOOTSTRAP=rel-tidelog-gateway:9400" in tls
    assert "TIDELOG_SECURITY_PROTOCOL=SSL TIDELOG_SSL_CAFILE=ca.crt" in tls
    assert "get secret tidelog-tls" in tls
