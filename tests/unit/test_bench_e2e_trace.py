"""bench/e2e_trace.py: the per-hop trace of end-to-end latency, run as the tool is run (its
own process, a real traced broker), and the environment its broker gets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench._processes import service_environment

ROOT = Path(__file__).resolve().parents[2]
LISTENER_OFF = "-event_engine_listener"
#: The short trace: records per second, measured seconds, warm-up seconds.
RATE, SECONDS, WARMUP_S = 500, 1, 0.5


@pytest.mark.parametrize(
    ("inherited", "expected"),
    [
        # What a bench process hands its children (tidelog._grpc_setup's choice).
        ("-event_engine_client", "-event_engine_client,-event_engine_listener"),
        (None, "-event_engine_listener,-event_engine_client"),
        # An operator's explicit choice wins.
        ("event_engine_listener", "event_engine_listener,-event_engine_client"),
    ],
)
def test_a_service_the_bench_starts_gets_the_services_grpc_transport(
    inherited: str | None, expected: str
) -> None:
    environ = {"PATH": "/bin"} if inherited is None else {"GRPC_EXPERIMENTS": inherited}
    env = service_environment(environ)
    assert env["GRPC_EXPERIMENTS"] == expected
    assert {k: v for k, v in env.items() if k != "GRPC_EXPERIMENTS"} == {
        k: v for k, v in environ.items() if k != "GRPC_EXPERIMENTS"
    }


@pytest.mark.timeout(120)
def test_a_short_trace_times_every_hop_on_a_broker_serving_like_a_real_one(
    tmp_path: Path,
) -> None:
    out = tmp_path / "trace.json"
    args = [
        sys.executable, "-m", "bench.e2e_trace", "--mode", "sync", "--rate", str(RATE),
        "--seconds", str(SECONDS), "--warmup-s", str(WARMUP_S), "--json", str(out),
    ]  # fmt: skip
    run = subprocess.run(
        args,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())["sync"]
    # Every measured record (those after the warm-up's) was matched at every hand-off.
    assert result["records"] == RATE * SECONDS
    hops = [name for name in result if "->" in name]
    assert hops == [
        "send->drain", "drain->write", "write->receive", "receive->append",
        "append->respond", "respond->arrive", "arrive->poll",
    ]  # fmt: skip
    # One broker clock: the handler takes a request before it appends it.
    assert result["receive->append"]["p50"] >= 0
    assert result["end_to_end"]["p50"] > 0
    # The traced broker chose the services' transport: its environment says so.
    assert LISTENER_OFF in result["broker_grpc_experiments"].split(",")
