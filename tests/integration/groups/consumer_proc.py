"""An SDK `Consumer` in a group, in its own process, for tests that kill it.

Usage: python -m tests.integration.groups.consumer_proc BOOTSTRAP GROUP TOPIC SESSION_MS
       [--instance ID] [--auto-commit] [--max-poll-interval-ms N] [--stall-after N]
       [--report-errors]

Processes records and commits after processing (at-least-once) unless
--auto-commit. Prints one JSON line per event on stdout:
    {"event": "assigned" | "revoked" | "lost", "partitions": [...]}
    {"event": "records", "records": [[partition, offset], ...]}   (processed)
--stall-after N: after N records, stop calling poll() for a long time (to
test max_poll_interval_ms), then poll again.
--report-errors: an error poll() or commit() raises is printed, {"event":
"error", "during": "poll" | "commit", "type": ..., "message": ...}, and
polling goes on (else it ends the process). A commit can fail so in any test
that stops the process: one frozen between its poll and its commit finds its
session gone when it goes on.
SIGTERM closes the consumer cleanly (a static member does not leave).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time

from tidelog import Consumer
from tidelog.errors import TidelogError


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def report(error: TidelogError, during: str, report_errors: bool) -> None:
    """Print `error` as an event (--report-errors), else raise it."""
    if not report_errors:
        raise error
    emit("error", during=during, type=type(error).__name__, message=str(error))


class Listener:
    def on_partitions_revoked(self, revoked: set) -> None:
        emit("revoked", partitions=sorted(p for _, p in revoked))

    def on_partitions_assigned(self, assigned: set) -> None:
        emit("assigned", partitions=sorted(p for _, p in assigned))

    def on_partitions_lost(self, lost: set) -> None:
        emit("lost", partitions=sorted(p for _, p in lost))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("group")
    parser.add_argument("topic")
    parser.add_argument("session_ms", type=int)
    parser.add_argument("--instance", default=None)
    parser.add_argument("--auto-commit", action="store_true")
    parser.add_argument("--max-poll-interval-ms", type=int, default=300_000)
    parser.add_argument("--stall-after", type=int, default=0)
    parser.add_argument("--report-errors", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    consumer = Consumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        group_instance_id=args.instance,
        session_timeout_ms=args.session_ms,
        heartbeat_interval_ms=max(200, args.session_ms // 6),
        max_poll_interval_ms=args.max_poll_interval_ms,
        enable_auto_commit=args.auto_commit,
        auto_commit_interval_ms=200,
    )
    emit("subscribing")
    consumer.subscribe([args.topic], listener=Listener())
    processed = 0
    stalled = False
    while not stop:
        try:
            polled = consumer.poll(timeout_ms=100)
        except TidelogError as exc:
            report(exc, "poll", args.report_errors)
            time.sleep(0.2)
            continue
        records = [[r.partition, r.offset] for rs in polled.values() for r in rs]
        if records:
            emit("records", records=records)
            processed += len(records)
            if not args.auto_commit:
                try:
                    consumer.commit()  # after processing: at-least-once
                except TidelogError as exc:
                    report(exc, "commit", args.report_errors)
        if args.stall_after and processed >= args.stall_after and not stalled:
            stalled = True
            emit("stalling")
            time.sleep(args.max_poll_interval_ms / 1000 * 2 + 1)
            emit("resuming")
    consumer.close()
    emit("closed")


if __name__ == "__main__":
    main()
