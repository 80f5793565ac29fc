"""Each distribution's wheel: what it requires and which packages it holds.

Builds the five wheels (`pip wheel --no-deps --no-build-isolation`, the
environment's setuptools, no network) from a copy of each part's files (so no
stale build/ directory can slip a deleted module into a wheel) into pytest's
cache, keyed by a hash of those files: a run where nothing changed builds
nothing.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = {
    "tidelog": ROOT / "sdk",
    "tidelog_server": ROOT / "services/common",
    "tidelog_broker": ROOT / "services/broker",
    "tidelog_coordinator": ROOT / "services/coordinator",
    "tidelog_gateway": ROOT / "services/gateway",
}
SERVICES = {"tidelog_broker", "tidelog_coordinator", "tidelog_gateway"}
SERVER_PACKAGES = {"tidelog_server", *SERVICES}


class Wheel:
    def __init__(self, path: Path) -> None:
        self.path = path
        with zipfile.ZipFile(path) as archive:
            self.names = archive.namelist()
            (metadata,) = [n for n in self.names if n.endswith(".dist-info/METADATA")]
            dist_info = metadata.split("/")[0]
            self.metadata = Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode())
            entry_points = f"{dist_info}/entry_points.txt"
            self.entry_points = (
                archive.read(entry_points).decode() if entry_points in self.names else ""
            )

    @property
    def top_level(self) -> set[str]:
        return {n.split("/")[0] for n in self.names if not n.split("/")[0].endswith(".dist-info")}

    def requires(self, extra: str | None = None) -> dict[str, str]:
        """name -> specifier (with its extras) of the requirements, of `extra` or the base."""
        found = {}
        for line in self.metadata.get_all("Requires-Dist") or []:
            spec, _, marker = line.partition(";")
            in_extra = re.search(r'extra == "([^"]+)"', marker)
            if (in_extra.group(1) if in_extra else None) != extra:
                continue
            name = re.match(r"[A-Za-z0-9._-]+", spec.strip())
            assert name is not None, line
            found[name.group(0).lower()] = spec.strip()[name.end() :].strip()
        return found


def _source_files(directory: Path) -> list[str]:
    """The part's files as git sees them (tracked or new, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "."],
        cwd=directory,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sorted(name for name in listed if (directory / name).is_file())


def _source_hash(directory: Path, files: list[str]) -> str:
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0" + (directory / name).read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def wheels(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Wheel]:
    cache = getattr(request.config, "cache", None)  # none under `-p no:cacheprovider`
    built = {}
    for package, directory in PARTS.items():
        files = _source_files(directory)
        key = f"wheels-{package}-{_source_hash(directory, files)}"
        out = cache.mkdir(key) if cache is not None else tmp_path_factory.mktemp(key)
        if not list(out.glob("*.whl")):
            source = tmp_path_factory.mktemp(package)
            for name in files:
                (source / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(directory / name, source / name)
            pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
            pip_wheel += ["--no-build-isolation", "--wheel-dir", str(out), str(source)]
            subprocess.run(pip_wheel, check=True, capture_output=True)
        (path,) = out.glob("*.whl")
        built[package] = Wheel(path)
    return built


def test_client_wheel_holds_only_the_client(wheels: dict[str, Wheel]) -> None:
    client = wheels["tidelog"]
    # pyspark_tidelog: the hook by which pyspark finds format("tidelog") (tidelog.spark).
    assert client.top_level == {"tidelog", "pyspark_tidelog"}
    for server_only in ("tidelog/_etcd/", "tidelog/internal/", "tidelog/cli/dev.py"):
        assert not [n for n in client.names if n.startswith(server_only)], server_only
    assert "tidelog/group/assignors.py" not in client.names
    assert "tidelog/v1/log_pb2.py" in client.names
    assert "tidelog/py.typed" in client.names


def test_client_requires_ranges_and_no_server_dependency(wheels: dict[str, Wheel]) -> None:
    requires = wheels["tidelog"].requires()
    assert set(requires) == {"grpcio", "protobuf", "crc32c"}
    for name in ("grpcio", "protobuf"):
        assert "==" not in requires[name] and "<" in requires[name], requires[name]


def test_client_codecs_are_extras(wheels: dict[str, Wheel]) -> None:
    client = wheels["tidelog"]
    assert set(client.metadata.get_all("Provides-Extra") or []) == {
        "lz4", "zstd", "snappy", "all", "arrow", "spark", "uvloop",
    }  # fmt: skip
    assert set(client.requires("lz4")) == {"lz4"}
    assert set(client.requires("zstd")) == {"zstandard"}
    assert set(client.requires("snappy")) == {"cramjam"}
    assert set(client.requires("all")) == {"lz4", "zstandard", "cramjam"}
    # The columnar read and the Spark data source.
    assert set(client.requires("arrow")) == {"pyarrow", "numpy"}
    assert set(client.requires("spark")) == {"pyspark", "pyarrow", "numpy"}
    # The blocking clients' loop (tidelog._event_loop): only where uvloop has wheels.
    listed = client.metadata.get_all("Requires-Dist") or []
    (uvloop,) = [r for r in listed if r.startswith("uvloop")]
    assert 'sys_platform != "win32"' in uvloop and "CPython" in uvloop, uvloop
    assert client.entry_points.split("[console_scripts]")[1].split() == [
        "tidelog",
        "=",
        "tidelog.cli:main",
    ]


def test_server_core_wheel(wheels: dict[str, Wheel]) -> None:
    core = wheels["tidelog_server"]
    assert core.top_level == {"tidelog_server"}
    for module in ("etcd/keys.py", "service_errors.py", "topic_configs.py"):
        assert f"tidelog_server/{module}" in core.names
    assert "tidelog_server/internal/replica_pb2_grpc.py" in core.names
    requires = core.requires()
    assert {"tidelog", "aetcd", "grpcio"} <= set(requires)
    assert not SERVER_PACKAGES & {name.replace("-", "_") for name in requires}
    assert "tidelog-dev = tidelog_server.dev:main" in core.entry_points


@pytest.mark.parametrize(
    ("package", "script", "needs"),
    [
        ("tidelog_broker", "tidelog-broker", {"grpcio-reflection", "grpcio-health-checking"}),
        ("tidelog_coordinator", "tidelog-coordinator", {"aetcd", "grpcio-health-checking"}),
        (
            "tidelog_gateway",
            "tidelog-gateway",
            {"aetcd", "grpcio-health-checking", "grpcio-reflection"},
        ),
    ],
)
def test_service_wheels(
    wheels: dict[str, Wheel], package: str, script: str, needs: set[str]
) -> None:
    wheel = wheels[package]
    assert wheel.top_level == {package}
    requires = wheel.requires()
    assert {"tidelog", "tidelog-server"} | needs <= set(requires)
    for other in SERVICES - {package}:
        assert other.replace("_", "-") not in requires
    assert f"{script} = {package}.__main__:main" in wheel.entry_points


def test_broker_installs_every_codec(wheels: dict[str, Wheel]) -> None:
    assert wheels["tidelog_broker"].requires()["tidelog"].startswith("[all]")


def test_coordinator_holds_the_assignors(wheels: dict[str, Wheel]) -> None:
    assert "tidelog_coordinator/assignors.py" in wheels["tidelog_coordinator"].names
