"""A consumer's time from assign + seek_to_end of many partitions to the first
record of every one, before and after a change, alternated in one run
(``python -m bench.reset_placement_ab --base main``).

One broker (this work tree's code: only the client differs between the sides)
holds a topic of `--partitions` partitions. Each run is a fresh client process
whose PYTHONPATH selects its side (bench._checkout exports `--base` with its
own compiled modules). The client creates a Consumer, then, timed:

1. assign(every partition) and seek_to_end(), and waits for position() of
   each (one round of ListOffsets; the placement of the partitions in the
   fetch session follows);
2. says so on stdout; this process then produces one record to every
   partition (a Producer created before the runs, so the same work for both
   sides) and tells the child; the child polls until it has a record of
   every partition.

Each run prints the wall time of the whole (`total_s`) and of step 1
(`positions_s`), the client process's CPU over the whole (user + system,
all its threads: the SDK's event loop thread included) and the broker's
over the run (the produce of step 2 included, the same for both sides). The summary gives
the medians per side and the number of rounds this work tree was faster.

Not part of ``make bench``: it needs a quiet machine; ~5 s per run at the
defaults.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _checkout  # noqa: E402
from bench._processes import cpu_s, tidelog_broker, tmpdir  # noqa: E402

THIS = "this"
TOPIC = "reset-placement"
#: Generous: bounds a broken run only.
CHILD_TIMEOUT_S = 300.0


def _child(address: str, partitions: int) -> None:
    """One run in this process (see module doc); prints its result as JSON."""
    import resource

    import tidelog
    from tidelog import Consumer, TopicPartition

    def cpu_s() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
    with Consumer(bootstrap_servers=address, auto_offset_reset="earliest") as consumer:
        consumer.topics()  # connected and metadata cached before the clock starts
        cpu0, t0 = cpu_s(), time.perf_counter()
        consumer.assign(tps)
        consumer.seek_to_end()
        for tp in tps:
            consumer.position(tp, timeout=60)
        t1 = time.perf_counter()
        print("positions", flush=True)
        sys.stdin.readline()  # the parent produced a record to every partition
        waiting = set(tps)
        deadline = time.monotonic() + 60
        while waiting and time.monotonic() < deadline:
            for tp in consumer.poll(timeout_ms=200):
                waiting.discard(tp)
        t2, cpu1 = time.perf_counter(), cpu_s()
        if waiting:
            raise SystemExit(f"no record of {len(waiting)} partitions")
    print(
        json.dumps(
            {
                "total_s": t2 - t0,
                "positions_s": t1 - t0,
                "cpu_s": cpu1 - cpu0,
                "sdk": tidelog.__file__,
            }
        ),
        flush=True,
    )


def _run(label: str, env: dict[str, str], address: str, partitions: int, produce: Any) -> dict:
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.reset_placement_ab", "--child", address, str(partitions)],
        cwd=str(ROOT),
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        line = child.stdout.readline()
        if line.strip() != "positions":
            raise RuntimeError(f"the {label} run failed before its positions: {line!r}")
        produce()
        child.stdin.write("go\n")
        child.stdin.flush()
        out, _ = child.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode != 0:
        raise RuntimeError(f"the {label} run failed (exit {child.returncode})")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="git ref of the 'before' side")
    parser.add_argument("--pairs", type=int, default=6, help="rounds (each runs both sides)")
    parser.add_argument("--partitions", type=int, default=1200)
    parser.add_argument(
        "--child", nargs=2, metavar=("ADDRESS", "PARTITIONS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return 0

    from tidelog import AdminClient, NewTopic, Producer

    runs: dict[str, list[dict[str, Any]]] = {args.base: [], THIS: []}
    with tmpdir("tidelog-reset-ab-") as export_dir, tidelog_broker() as broker:
        sides = {
            args.base: (_checkout.environment(_checkout.export(args.base, export_dir)), export_dir),
            THIS: (_checkout.environment(None), ROOT),
        }
        with AdminClient(broker.address) as admin:
            admin.create_topics([NewTopic(TOPIC, args.partitions, 1)])
        with Producer(broker.address, linger_ms=20) as producer:

            def produce() -> None:
                for p in range(args.partitions):
                    producer.send(TOPIC, b"x", partition=p)
                producer.flush()

            produce()  # warm
            order = [args.base, THIS]
            for r in range(args.pairs):
                for label in order if r % 2 == 0 else order[::-1]:
                    env, root = sides[label]
                    before = cpu_s(broker.pid)
                    result = _run(label, env, broker.address, args.partitions, produce)
                    result["broker_cpu_s"] = cpu_s(broker.pid) - before
                    if not Path(result["sdk"]).is_relative_to(root):
                        raise RuntimeError(f"the {label} run imported {result['sdk']}")
                    runs[label].append(result)
                    print(
                        f"round {r} {label:>6}: total {result['total_s']:.3f} s, positions "
                        f"{result['positions_s']:.3f} s, client CPU {result['cpu_s']:.3f} s, "
                        f"broker CPU {result['broker_cpu_s']:.3f} s",
                        flush=True,
                    )
    for label, results in runs.items():
        print(
            f"{label:>6} medians: total {statistics.median(r['total_s'] for r in results):.3f} s, "
            f"positions {statistics.median(r['positions_s'] for r in results):.3f} s, "
            f"client CPU {statistics.median(r['cpu_s'] for r in results):.3f} s, "
            f"broker CPU {statistics.median(r['broker_cpu_s'] for r in results):.3f} s"
        )
    faster = sum(
        t["total_s"] < b["total_s"] for t, b in zip(runs[THIS], runs[args.base], strict=True)
    )
    print(f"{THIS} faster in {faster} of {args.pairs} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
