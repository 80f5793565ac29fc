"""`tidelog dev`: the local cluster, in the foreground, for development.

Starts the broker process(es) with data under one directory (reused on the
next start), waits until each answers its health check, prints the
endpoints and three commands to try, and stops every process it started on
Ctrl-C or SIGTERM.

The broker is a separate program (`python -m tidelog_broker`); the SDK does
not import it, it only runs it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidelog.cli._common import AddBootstrap, fail

FIRST_PORT = 9392
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def register(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    parser = sub.add_parser("dev", help="run a local cluster in the foreground (make run)")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(".tidelog"), help="where data lives (reused)"
    )
    parser.add_argument("--brokers", type=int, default=1, help="number of brokers (default 1)")
    parser.add_argument("--port", type=int, default=FIRST_PORT, help="first broker's port")
    parser.set_defaults(handler=_dev)


def wait_until_serving(address: str, timeout_s: float, process: subprocess.Popen[bytes]) -> None:
    """Poll the gRPC health check of `address` until SERVING."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(
                    f"the process for {address} exited with code {process.returncode}"
                )
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise RuntimeError(f"{address} did not become ready within {timeout_s:.0f} s")


def _dev(args: argparse.Namespace) -> int:
    if args.brokers != 1:
        # Several brokers need the coordinator (cluster metadata on etcd) to
        # agree on who leads what; until it exists, one broker is the cluster.
        return fail("--brokers > 1 needs the coordinator, which is not built yet; use 1")
    data_dir: Path = args.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    processes: list[subprocess.Popen[bytes]] = []

    def stop_all(*_: object) -> None:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    endpoints = []
    try:
        for broker_id in range(args.brokers):
            address = f"127.0.0.1:{args.port + broker_id}"
            broker_dir = data_dir / f"broker-{broker_id}"
            log_path = data_dir / f"broker-{broker_id}.log"
            with open(log_path, "ab") as log_file:
                processes.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "tidelog_broker",
                            "--listen",
                            address,
                            "--data-dir",
                            str(broker_dir),
                            "--broker-id",
                            str(broker_id),
                            "--auto-create-topics",
                        ],
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        env={**os.environ, "PYTHONUNBUFFERED": "1"},
                    )
                )
            wait_until_serving(address, READY_TIMEOUT_S, processes[-1])
            endpoints.append((f"broker {broker_id}", address, broker_dir, log_path))
        bootstrap = endpoints[0][1]
        print("Tidelog is running.")
        for name, address, directory, log_path in endpoints:
            print(f"  {name}: {address}  data {directory}  log {log_path}")
        print()
        print("Try, in another terminal (with .venv/bin on PATH):")
        print(f"  tidelog topics create greetings --partitions 3 --bootstrap-server {bootstrap}")
        print(
            "  printf 'hello\\nworld\\n' | tidelog produce greetings "
            f"--bootstrap-server {bootstrap}"
        )
        print(
            "  tidelog consume greetings --from-beginning --timeout-ms 2000 "
            f"--bootstrap-server {bootstrap}"
        )
        print()
        print("Ctrl-C stops everything.", flush=True)
        while True:
            for process in processes:
                if process.poll() is not None:
                    return fail(
                        f"a broker exited with code {process.returncode}; see {endpoints[0][3]}"
                    )
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nstopping...", file=sys.stderr)
        return 0
    except RuntimeError as exc:
        return fail(str(exc))
    finally:
        stop_all()
