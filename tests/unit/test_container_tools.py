"""The tools behind `make images` and tests/containers, where no Docker engine answers:
tools/images.py and tools/docker-engine.sh say what is missing and how to get it (exit 3,
which the container tests turn into a skip), and `docker-engine.sh stop` stops only the
dockerd that it started itself, by the PID in its own pidfile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "tools/docker-engine.sh"
DEAD = "unix:///nonexistent/docker.sock"


def run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=50, env={**os.environ, **env}
    )


def test_images_without_an_engine_exit_3_naming_how_to_start_one() -> None:
    done = run([sys.executable, str(ROOT / "tools/images.py")], DOCKER_HOST=DEAD)
    assert done.returncode == 3, done
    assert "does not answer" in done.stderr and "tools/docker-engine.sh start" in done.stderr


def test_images_names_the_images_it_knows() -> None:
    done = run([sys.executable, str(ROOT / "tools/images.py"), "kafka"], DOCKER_HOST=DEAD)
    assert done.returncode == 2
    assert "no image named kafka" in done.stderr and "broker" in done.stderr


def test_engine_host_is_the_given_docker_host_or_none(tmp_path: Path) -> None:
    # DOCKER_HOST set: that engine or nothing (never another one behind the caller's back).
    done = run([str(ENGINE), "host"], DOCKER_HOST=DEAD, TIDELOG_DOCKER_STATE=str(tmp_path))
    assert done.returncode == 3, done
    assert "tools/docker-engine.sh start" in done.stderr


def test_engine_stop_leaves_a_process_it_did_not_start(tmp_path: Path) -> None:
    # A pidfile naming a process that is not our dockerd (a PID reused, a stale file).
    other = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "docker.pid").write_text(f"{other.pid}\n")
        done = run([str(ENGINE), "stop"], TIDELOG_DOCKER_STATE=str(tmp_path))
        assert done.returncode == 0, done
        assert other.poll() is None, "docker-engine.sh stop killed a process it did not start"
        assert not (tmp_path / "docker.pid").exists()
        # Nothing started, nothing to stop.
        assert run([str(ENGINE), "stop"], TIDELOG_DOCKER_STATE=str(tmp_path)).returncode == 0
    finally:
        other.kill()
        other.wait()
