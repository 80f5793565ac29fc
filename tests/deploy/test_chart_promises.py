"""What the chart promises, read from the manifests it renders (default and
production values, via the `rendered` fixture): stable broker ids and
volumes, PodDisruptionBudgets, gRPC probes on each service's health port,
anti-affinity, non-root read-only pods, an upgrade order that keeps every
partition writable with acks=all (docs/deploy.md explains it), metrics that
Prometheus finds (annotations, Services, an optional ServiceMonitor, the
Grafana dashboard), and TLS from a mounted Secret on every service."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.deploy.chart import (
    CHART,
    NAMESPACE,
    RELEASE,
    Chart,
    Rendered,
    container,
    env_value,
    pod_spec,
    selects,
)
from tests.deploy.conftest import HELM_BUILD_TIMEOUT_S

# One worker runs every chart test: only it waits for a first build of helm.
pytestmark = [pytest.mark.timeout(HELM_BUILD_TIMEOUT_S + 300), pytest.mark.xdist_group("helm")]

TIDELOG = ["broker", "coordinator", "gateway"]
#: Labels whose value changes with each chart or app version: never in an
#: immutable field (selectors, volumeClaimTemplates), or upgrades fail.
VERSIONED_LABELS = {"helm.sh/chart", "app.kubernetes.io/version"}


def arg(ctr: dict, flag: str) -> str:
    """The value of `--flag=value` in a container's args."""
    values = [a.split("=", 1)[1] for a in ctr["args"] if a.startswith(flag + "=")]
    assert len(values) == 1, f"{flag} given {len(values)} times in {ctr['args']}"
    return values[0]


def workload(rendered: Rendered, component: str) -> dict:
    kind = "StatefulSet" if component in ("broker", "etcd") else "Deployment"
    return rendered.one(kind, component)


# ------------------------------------------------------------ brokers


def test_brokers_are_a_statefulset_with_a_claim_each_and_ids_from_their_ordinal(
    rendered: Rendered,
) -> None:
    brokers = rendered.one("StatefulSet", "broker")
    ctr = container(brokers)
    # The id is the pod ordinal: same pod name, same id, same claim.
    assert "--broker-id-from-hostname" in ctr["args"]
    assert not any(a.startswith("--broker-id=") for a in ctr["args"])
    (claim,) = brokers["spec"]["volumeClaimTemplates"]
    data_mount = next(m for m in ctr["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    assert arg(ctr, "--data-dir").startswith(data_mount["mountPath"] + "/")
    assert claim["spec"]["resources"]["requests"]["storage"]
    assert brokers["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Retain"


def test_brokers_advertise_their_stable_name_in_a_headless_service(rendered: Rendered) -> None:
    brokers = rendered.one("StatefulSet", "broker")
    headless = rendered.named("Service", brokers["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    # A broker catching up (not Ready) must still be reachable by its peers.
    assert headless["spec"]["publishNotReadyAddresses"] is True
    # Followers fetch from leaders on the internal port, through these names.
    assert {p["name"] for p in headless["spec"]["ports"]} == {"grpc", "internal"}
    assert selects(
        {"matchLabels": headless["spec"]["selector"]},
        brokers["spec"]["template"]["metadata"]["labels"],
    )
    advertised = next(
        a for a in container(brokers)["args"] if a.startswith("--set=advertised.host=")
    )
    assert advertised.endswith(
        f"=$(POD_NAME).{headless['metadata']['name']}.$(POD_NAMESPACE).svc.cluster.local"
    )
    assert env_value(container(brokers), "POD_NAME") == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_broker_defaults_are_a_configmap_with_kafka_names_and_roll_the_brokers(
    rendered: Rendered,
) -> None:
    brokers = rendered.one("StatefulSet", "broker")
    ctr = container(brokers)
    config_volume = next(v for v in pod_spec(brokers)["volumes"] if v["name"] == "config")
    configmap = rendered.named("ConfigMap", config_volume["configMap"]["name"])
    mount = next(m for m in ctr["volumeMounts"] if m["name"] == "config")
    assert arg(ctr, "--config") == mount["mountPath"] + "/server.properties"
    lines = configmap["data"]["server.properties"].split()
    assert "min.insync.replicas=2" in lines
    assert all(re.fullmatch(r"[a-z][a-z0-9.]*=\S*", line) for line in lines), lines
    assert "checksum/config" in brokers["spec"]["template"]["metadata"]["annotations"]


def test_rack_comes_from_the_pods_topology_label_when_enabled(
    production_render: Rendered, default_render: Rendered
) -> None:
    ctr = container(production_render.one("StatefulSet", "broker"))
    assert "--rack=$(TIDELOG_RACK)" in ctr["args"]
    assert env_value(ctr, "TIDELOG_RACK") == {
        "fieldRef": {"fieldPath": "metadata.labels['topology.kubernetes.io/zone']"}
    }
    assert not any(
        a.startswith("--rack")
        for a in container(default_render.one("StatefulSet", "broker"))["args"]
    )


# ------------------------------------------------------------ disruption budgets


@pytest.mark.parametrize("component", [*TIDELOG, "etcd"])
def test_every_workload_has_a_disruption_budget_of_one(rendered: Rendered, component: str) -> None:
    pods = workload(rendered, component)["spec"]["template"]["metadata"]["labels"]
    budgets = [
        p for p in rendered.of_kind("PodDisruptionBudget") if selects(p["spec"]["selector"], pods)
    ]
    assert len(budgets) == 1, component
    assert budgets[0]["spec"]["maxUnavailable"] == 1


def test_coordinators_are_at_least_two(rendered: Rendered) -> None:
    assert rendered.one("Deployment", "coordinator")["spec"]["replicas"] >= 2


# ------------------------------------------------------------ probes


@pytest.mark.parametrize("component", TIDELOG)
def test_grpc_probes_ask_the_health_service_on_the_serving_port(
    rendered: Rendered, component: str
) -> None:
    ctr = container(workload(rendered, component))
    port = int(arg(ctr, "--listen").rpartition(":")[2])
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    if component == "broker":
        # Replication has a listener of its own; probes ask the client one.
        assert ports.pop("internal") == int(arg(ctr, "--internal-port")) != port
    assert ports.pop("metrics") == int(arg(ctr, "--metrics-port")) != port
    assert ports == {"grpc": port}
    for probe in ("livenessProbe", "readinessProbe"):
        assert ctr[probe]["grpc"]["port"] == port, (component, probe)
    assert ctr["livenessProbe"]["grpc"]["service"] == ""
    # A broker is Ready once it is in the ISR of every partition it hosts.
    ready = "tidelog.broker.InSync" if component == "broker" else ""
    assert ctr["readinessProbe"]["grpc"]["service"] == ready


def test_the_in_sync_health_name_is_the_brokers(rendered: Rendered) -> None:
    from tidelog_broker.server import IN_SYNC_HEALTH

    ctr = container(rendered.one("StatefulSet", "broker"))
    assert ctr["readinessProbe"]["grpc"]["service"] == IN_SYNC_HEALTH


# ------------------------------------------------------------ placement


@pytest.mark.parametrize("component", [*TIDELOG, "etcd"])
def test_pods_of_a_component_avoid_each_other(rendered: Rendered, component: str) -> None:
    spec = workload(rendered, component)["spec"]
    anti = pod_spec(workload(rendered, component))["affinity"]["podAntiAffinity"]
    terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution") or [
        t["podAffinityTerm"] for t in anti["preferredDuringSchedulingIgnoredDuringExecution"]
    ]
    assert any(
        t["topologyKey"] and selects(t["labelSelector"], spec["template"]["metadata"]["labels"])
        for t in terms
    )


def test_production_requires_one_broker_per_node(production_render: Rendered) -> None:
    anti = pod_spec(production_render.one("StatefulSet", "broker"))["affinity"]["podAntiAffinity"]
    (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"


# ------------------------------------------------------------ security


@pytest.mark.parametrize("component", [*TIDELOG, "etcd"])
def test_pods_run_as_non_root_on_a_read_only_root_filesystem(
    rendered: Rendered, component: str
) -> None:
    pod = pod_spec(workload(rendered, component))
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    ctr = container(workload(rendered, component))
    security = ctr["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert ctr["resources"]["requests"]["cpu"] and ctr["resources"]["limits"]["memory"]


def test_brokers_write_only_to_their_volume_and_tmp(rendered: Rendered) -> None:
    ctr = container(rendered.one("StatefulSet", "broker"))
    writable = {m["mountPath"] for m in ctr["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/var/lib/tidelog", "/tmp"}


# ------------------------------------------------------------ upgrades


def test_brokers_roll_one_at_a_time_waiting_until_each_is_back_in_sync(rendered: Rendered) -> None:
    spec = rendered.one("StatefulSet", "broker")["spec"]
    assert spec["updateStrategy"]["type"] == "RollingUpdate"
    # No maxUnavailable: the StatefulSet controller replaces one pod, waits
    # for it to be Ready (readiness = InSync) for minReadySeconds, then the next.
    assert set(spec["updateStrategy"]["rollingUpdate"]) == {"partition"}
    assert spec["minReadySeconds"] > 0
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] >= 30


@pytest.mark.parametrize("component", ["coordinator", "gateway"])
def test_deployments_start_a_new_pod_before_stopping_an_old_one(
    rendered: Rendered, component: str
) -> None:
    rolling = rendered.one("Deployment", component)["spec"]["strategy"]["rollingUpdate"]
    assert rolling == {"maxUnavailable": 0, "maxSurge": 1}


def test_immutable_fields_carry_no_version_so_upgrades_apply(rendered: Rendered) -> None:
    for item in rendered.workloads():
        assert not VERSIONED_LABELS & set(item["spec"]["selector"]["matchLabels"])
        for claim in item["spec"].get("volumeClaimTemplates", []):
            assert not VERSIONED_LABELS & set(claim["metadata"].get("labels", {}))
    for service in rendered.of_kind("Service"):
        assert not VERSIONED_LABELS & set(service["spec"]["selector"])


# ------------------------------------------------------------ etcd and the gateway


def test_services_are_given_every_bundled_etcd_member(rendered: Rendered) -> None:
    etcd = rendered.one("StatefulSet", "etcd")
    assert etcd["spec"]["replicas"] == 3
    assert etcd["spec"]["podManagementPolicy"] == "Parallel"
    name, service = etcd["metadata"]["name"], etcd["spec"]["serviceName"]
    members = ",".join(f"{name}-{i}.{service}.{NAMESPACE}.svc.cluster.local:2379" for i in range(3))
    for component in TIDELOG:
        ctr = container(workload(rendered, component))
        assert env_value(ctr, "TIDELOG_ETCD") == members
        assert arg(ctr, "--etcd") == "$(TIDELOG_ETCD)"


def test_external_etcd_replaces_the_bundled_one(chart: Chart) -> None:
    rendered = chart.render(
        "--set", "etcd.enabled=false", "--set", "etcd.externalEndpoints={e1:2379,e2:2379}"
    )
    assert not [m for m in rendered.manifests if m["metadata"]["name"].endswith("-etcd")]
    for component in TIDELOG:
        assert (
            env_value(container(workload(rendered, component)), "TIDELOG_ETCD") == "e1:2379,e2:2379"
        )


def test_the_gateway_service_reaches_the_gateways(rendered: Rendered) -> None:
    gateway = rendered.one("Deployment", "gateway")
    service = rendered.named("Service", f"{RELEASE}-tidelog-gateway")
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "grpc"
    assert selects(
        {"matchLabels": service["spec"]["selector"]},
        gateway["spec"]["template"]["metadata"]["labels"],
    )


def test_the_gateway_autoscales_in_production(production_render: Rendered) -> None:
    gateway = production_render.one("Deployment", "gateway")
    hpa = production_render.one("HorizontalPodAutoscaler", "gateway")
    assert hpa["spec"]["scaleTargetRef"]["name"] == gateway["metadata"]["name"]
    # The HPA owns the replica count: the Deployment must not reset it.
    assert "replicas" not in gateway["spec"]
    assert (CHART / "values-production.yaml").exists()


# ------------------------------------------------------------ metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "tidelog.json"


@pytest.mark.parametrize("component", TIDELOG)
def test_every_service_serves_metrics_on_a_named_port_prometheus_finds(
    rendered: Rendered, component: str
) -> None:
    pods = workload(rendered, component)["spec"]["template"]
    ctr = container(workload(rendered, component))
    port = int(arg(ctr, "--metrics-port"))
    # On the pod's address, not the default 127.0.0.1 (unreachable from Prometheus).
    assert arg(ctr, "--metrics-host") == arg(ctr, "--listen").rpartition(":")[0]
    assert {"name": "metrics", "containerPort": port} in ctr["ports"]
    annotations = pods["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"
    (service,) = [
        s for s in rendered.of_kind("Service")
        if selects({"matchLabels": s["spec"]["selector"]}, pods["metadata"]["labels"])
        and any(p["name"] == "metrics" for p in s["spec"]["ports"])
    ]  # fmt: skip
    # Headless and of its own: never the gateway's client Service.
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [{"name": "metrics", "port": port, "targetPort": "metrics"}]


def test_metrics_off_means_no_port_flag_annotation_or_service(chart: Chart) -> None:
    rendered = chart.render("--set", "metrics.enabled=false")
    for component in TIDELOG:
        pods = workload(rendered, component)["spec"]["template"]
        ctr = pods["spec"]["containers"][0]
        assert not any(a.startswith("--metrics") for a in ctr["args"])
        assert "metrics" not in {p["name"] for p in ctr["ports"]}
        assert "prometheus.io/scrape" not in pods["metadata"].get("annotations", {})
    services = [s["metadata"]["name"] for s in rendered.of_kind("Service")]
    assert not [name for name in services if name.endswith("-metrics")]


def test_a_components_own_annotations_win_without_duplicate_keys(chart: Chart) -> None:
    values = ("--set", "broker.podAnnotations.prometheus\\.io/path=/custom")
    raw = chart.run(
        "template", "rel", str(CHART), "--show-only", "templates/broker-statefulset.yaml", *values
    )
    # YAML readers differ on duplicate keys (PyYAML keeps the last): one key, one value.
    assert raw.count("prometheus.io/path:") == 1
    annotations = chart.render(*values).one("StatefulSet", "broker")["spec"]["template"]
    assert annotations["metadata"]["annotations"]["prometheus.io/path"] == "/custom"


def test_the_service_monitor_is_off_by_default_and_scrapes_every_metrics_service(
    rendered: Rendered, chart: Chart
) -> None:
    assert not rendered.of_kind("ServiceMonitor")
    on = chart.render(
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.serviceMonitor.labels.release=kube-prometheus",
    )  # fmt: skip
    (monitor,) = on.of_kind("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    scraped = {
        s["metadata"]["labels"]["app.kubernetes.io/component"]
        for s in on.of_kind("Service")
        if selects(monitor["spec"]["selector"], s["metadata"]["labels"])
    }
    assert scraped == set(TIDELOG)
    for service in on.of_kind("Service"):
        if selects(monitor["spec"]["selector"], service["metadata"]["labels"]):
            assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]


def test_the_grafana_dashboard_is_an_optional_configmap_for_the_sidecar(
    rendered: Rendered, chart: Chart
) -> None:
    assert not [m for m in rendered.of_kind("ConfigMap") if "grafana" in m["metadata"]["name"]]
    on = chart.render("--set", "metrics.grafanaDashboard.enabled=true")
    (dashboard,) = [m for m in on.of_kind("ConfigMap") if "grafana" in m["metadata"]["name"]]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    # The chart's copy is deploy/grafana/tidelog.json, byte for byte.
    assert dashboard["data"]["tidelog.json"] == DASHBOARD.read_text().rstrip("\n")
    assert json.loads(dashboard["data"]["tidelog.json"])["uid"] == "tidelog-overview"


def test_the_charts_dashboard_is_the_one_in_deploy_grafana() -> None:
    """A chart reads only its own files: it holds a copy. Edit
    deploy/grafana/tidelog.json, then copy it to dashboards/tidelog.json."""
    assert (CHART / "dashboards" / "tidelog.json").read_bytes() == DASHBOARD.read_bytes()


OPERATIONS = DASHBOARD.parents[2] / "docs" / "operations.md"


def test_the_dashboard_shows_every_cluster_metric_the_docs_say_to_alert_on() -> None:
    """Every metric of the coordinator's table in docs/operations.md with
    something in its alert column (the cluster's health, the groups) is
    queried by a panel: an operator who looks at the dashboard sees what the
    runbooks tell them to watch. (The brokers' own gauges of the same facts
    are per-broker views of these.) tidelog_cluster_offline_replicas had no
    panel."""
    text = OPERATIONS.read_text()
    table = text[text.index("**Coordinator**") : text.index("**Gateway**")]
    # | metric | type | meaning | alert |
    rows = [row.split("|")[1:-1] for row in table.splitlines() if row.startswith("| `")]
    alerted = {
        name
        for cells in rows
        if cells[-1].strip()
        for name in re.findall(r"`(tidelog_[a-z_]+)", cells[0])
    }
    queried = " ".join(
        target["expr"]
        for panel in json.loads(DASHBOARD.read_text())["panels"]
        for target in panel.get("targets", [])
    )
    assert "tidelog_cluster_offline_replicas" in alerted, sorted(alerted)
    assert sorted(n for n in alerted if not re.search(rf"\b{n}\b", queried)) == []


#: The runbook of a replica whose log is offline (a heading of OPERATIONS).
OFFLINE_LOG_RUNBOOK = "A partition's log goes offline (STORAGE_ERROR)"


def test_the_dashboard_shows_offline_logs_per_broker_with_their_runbook() -> None:
    """tidelog_broker_offline_partitions, which docs/operations.md pages on,
    had no panel: the cluster-wide Offline replicas stat counts a failed
    log and a down broker alike, and names no broker."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    (panel,) = [
        p
        for p in panels
        if any("tidelog_broker_offline_partitions" in t["expr"] for t in p.get("targets", []))
    ]
    (target,) = panel["targets"]
    # One series per broker, named by its id (stable across pod moves).
    assert re.search(r"\bby \(broker_id\) \(tidelog_broker_offline_partitions\)", target["expr"])
    assert "{{broker_id}}" in target["legendFormat"]
    assert panel["type"] == "timeseries"
    assert f'docs/operations.md, "{OFFLINE_LOG_RUNBOOK}"' in panel["description"]


#: The runbook of partitions below min.insync.replicas (a heading of OPERATIONS).
UNDER_MIN_ISR_RUNBOOK = "Is the cluster healthy?"


def test_the_dashboard_shows_under_min_isr_partitions_per_broker_with_their_runbook() -> None:
    """tidelog_broker_under_min_isr_partitions, which docs/operations.md
    pages on, had no panel: the Under min ISR stat is the controller's
    cluster-wide count and names no leader."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    (panel,) = [
        p
        for p in panels
        if any("tidelog_broker_under_min_isr_partitions" in t["expr"] for t in p.get("targets", []))
    ]
    (target,) = panel["targets"]
    # One series per broker (the leader that counts them), named by its id.
    assert re.search(
        r"\bby \(broker_id\) \(tidelog_broker_under_min_isr_partitions\)", target["expr"]
    )
    assert "{{broker_id}}" in target["legendFormat"]
    assert panel["type"] == "timeseries"
    assert f'docs/operations.md, "{UNDER_MIN_ISR_RUNBOOK}"' in panel["description"]
    # The runbook says what the panel is about.
    text = OPERATIONS.read_text()
    runbook = text[text.index(f"## {UNDER_MIN_ISR_RUNBOOK}") :]
    runbook = runbook[: runbook.index("\n## ")]
    assert "tidelog_broker_under_min_isr_partitions" in runbook
    assert "--under-min-isr-partitions" in runbook


def test_every_runbook_a_panel_names_is_a_section_of_the_operations_docs() -> None:
    headings = {
        line.lstrip("#").strip() for line in OPERATIONS.read_text().splitlines() if line[:1] == "#"
    }
    assert {OFFLINE_LOG_RUNBOOK, UNDER_MIN_ISR_RUNBOOK} <= headings
    named = [
        (panel["title"], section)
        for panel in json.loads(DASHBOARD.read_text())["panels"]
        for section in re.findall(r'docs/operations\.md, "([^"]+)"', panel.get("description", ""))
    ]
    # The offline replicas, the offline logs, the partitions under min ISR.
    assert len(named) >= 3, named
    assert [(title, s) for title, s in named if s not in headings] == []


def test_the_dashboards_panels_have_unique_ids_and_do_not_overlap() -> None:
    """Grafana draws overlapping panels on top of each other (or pushes one
    down, hiding the layout meant): each panel's gridPos is its own cell of
    the 24-column grid."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), sorted(ids)
    cells: dict[tuple[int, int], str] = {}
    clashes = []
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["w"] > 0 and pos["h"] > 0 and pos["x"] >= 0 and pos["y"] >= 0, panel["title"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                if (x, y) in cells:
                    clashes.append((cells[(x, y)], panel["title"]))
                cells[(x, y)] = panel["title"]
    assert sorted(set(clashes)) == []


# ------------------------------------------------------------ TLS

TLS_SECRET = "tidelog-tls"


@pytest.fixture(scope="module")
def tls_render(chart: Chart) -> Rendered:
    return chart.render(
        "--set", "tls.enabled=true", "--set", f"tls.existingSecret={TLS_SECRET}",
        "--set", "tls.clientAuth=require",
    )  # fmt: skip


@pytest.mark.parametrize("component", TIDELOG)
def test_tls_mounts_the_secret_read_only_and_gives_every_service_its_files(
    tls_render: Rendered, component: str
) -> None:
    pod = pod_spec(workload(tls_render, component))
    ctr = container(workload(tls_render, component))
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == TLS_SECRET
    # Group-readable (the pod's fsGroup), not world-readable.
    assert volume["secret"]["defaultMode"] == 0o440
    (mount,) = [m for m in ctr["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    # A subPath mount is never updated: rotation would need a restart.
    assert "subPath" not in mount
    directory = mount["mountPath"]
    assert arg(ctr, "--tls-certfile") == f"{directory}/tls.crt"
    assert arg(ctr, "--tls-keyfile") == f"{directory}/tls.key"
    assert arg(ctr, "--tls-cafile") == f"{directory}/ca.crt"
    assert arg(ctr, "--tls-client-auth") == "require"


@pytest.mark.parametrize("component", TIDELOG)
def test_with_tls_probes_run_the_health_command_over_tls(
    tls_render: Rendered, rendered: Rendered, component: str
) -> None:
    ctr = container(workload(tls_render, component))
    plain = container(workload(rendered, component))
    port = int(arg(ctr, "--listen").rpartition(":")[2])
    probes = [p for p in ("startupProbe", "livenessProbe", "readinessProbe") if p in ctr]
    assert probes == [p for p in ("startupProbe", "livenessProbe", "readinessProbe") if p in plain]
    for probe in probes:
        # Kubernetes' gRPC probe speaks no TLS: none is left.
        assert "grpc" not in ctr[probe]
        command = ctr[probe]["exec"]["command"]
        assert command[0] == "tidelog-health"
        options = dict(a.split("=", 1) for a in command[1:])
        assert options["--address"] == f"127.0.0.1:{port}"
        # The same health service as the plaintext probe asks.
        assert options["--service"] == plain[probe]["grpc"]["service"]
        for flag in ("--tls-cafile", "--tls-certfile", "--tls-keyfile"):
            assert options[flag] == arg(ctr, flag)
        # The command's own deadline ends before the kubelet gives up on it.
        assert float(options["--timeout-s"]) < ctr[probe]["timeoutSeconds"]
        # The server's certificate is checked for a name its peers dial.
        assert options["--server-name"] == peer_name(tls_render, component)


def peer_name(rendered: Rendered, component: str) -> str:
    """A name under which the component's peers and clients reach it."""
    domain = f"{NAMESPACE}.svc.cluster.local"
    if component == "gateway":
        return f"{RELEASE}-tidelog-gateway.{domain}"
    ctr = container(workload(rendered, component))
    if component == "broker":
        advertised = arg(ctr, "--set").removeprefix("advertised.host=")
    else:  # the shell in front of the coordinator computes it (test_chart_cli)
        advertised = ctr["command"][2].split('--advertised-host="')[1].rstrip('"')
    # $(POD_NAME) or $(echo $POD_IP | ...), then .<headless service>.<namespace>.svc...
    _first, _, rest = advertised.partition(").")
    service = rest.split(".")[0]
    return f"health.{service}.{domain}"


def test_the_health_command_is_shipped_with_the_server_core() -> None:
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="tidelog-health")
    assert script.dist is not None and script.dist.name == "tidelog-server"


def test_with_tls_no_port_claims_cleartext_http2(tls_render: Rendered) -> None:
    for service in tls_render.of_kind("Service"):
        for port in service["spec"]["ports"]:
            assert port.get("appProtocol") != "kubernetes.io/h2c", service["metadata"]["name"]


def test_tls_off_mounts_nothing_and_keeps_native_grpc_probes(rendered: Rendered) -> None:
    for component in TIDELOG:
        ctr = container(workload(rendered, component))
        assert not any(a.startswith("--tls") for a in ctr["args"])
        assert not [v for v in pod_spec(workload(rendered, component))["volumes"] if "secret" in v]
        assert "grpc" in ctr["livenessProbe"]
