"""Rendering the Helm chart and reading what it rendered (tests/deploy).

`Chart(helm, path).render(*helm_args)` runs `helm template` and returns a
`Rendered`: the manifests as dicts, with look-ups by kind, name and
component (the `app.kubernetes.io/component` label).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "tidelog"
RELEASE = "rel"
NAMESPACE = "stream"
#: The oldest Kubernetes the chart supports (gRPC probes are GA in 1.27).
KUBE_VERSION = "1.27.0"

Manifest = dict[str, Any]


class HelmError(Exception):
    """helm exited non-zero; the message is its stderr."""


@dataclass
class Rendered:
    manifests: list[Manifest]

    def of_kind(self, kind: str) -> list[Manifest]:
        return [m for m in self.manifests if m["kind"] == kind]

    def one(self, kind: str, component: str) -> Manifest:
        found = [m for m in self.of_kind(kind) if component_of(m) == component]
        assert len(found) == 1, f"{len(found)} {kind} of component {component}"
        return found[0]

    def named(self, kind: str, name: str) -> Manifest:
        found = [m for m in self.of_kind(kind) if m["metadata"]["name"] == name]
        assert len(found) == 1, f"{len(found)} {kind} named {name}"
        return found[0]

    def workloads(self) -> list[Manifest]:
        return self.of_kind("StatefulSet") + self.of_kind("Deployment")


def component_of(manifest: Manifest) -> str:
    return str(manifest["metadata"].get("labels", {}).get("app.kubernetes.io/component", ""))


def pod_spec(workload: Manifest) -> Manifest:
    return workload["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def container(workload: Manifest) -> Manifest:
    (only,) = pod_spec(workload)["containers"]
    return only  # type: ignore[no-any-return]


def env_value(ctr: Manifest, name: str) -> Any:
    for entry in ctr.get("env", []):
        if entry["name"] == name:
            return entry.get("value", entry.get("valueFrom"))
    raise KeyError(f"no env {name} in container {ctr['name']}")


def selects(selector: Manifest, labels: Manifest) -> bool:
    """Whether matchLabels `selector` selects pods labelled `labels`."""
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


class Chart:
    def __init__(self, helm: Path, path: Path) -> None:
        self.helm = helm
        self.path = path

    def run(self, *args: str) -> str:
        result = subprocess.run(
            [str(self.helm), *args], capture_output=True, text=True, timeout=120, check=False
        )
        if result.returncode != 0:
            raise HelmError(result.stderr.strip())
        return result.stdout

    def render(self, *args: str, kube_version: str = KUBE_VERSION) -> Rendered:
        out = self.run(
            "template", RELEASE, str(self.path), "--namespace", NAMESPACE,
            "--kube-version", kube_version, *args,
        )  # fmt: skip
        return Rendered([doc for doc in yaml.safe_load_all(out) if doc])
