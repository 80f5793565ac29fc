"""An SDK `AsyncConsumer` in a group, in its own process, that commits after
every record it is handed: for tests that kill it between records.

Usage: python -m tests.integration.groups.async_consumer_proc BOOTSTRAP GROUP TOPIC
       --read {iter,getone} [--stop-after N]

Reads one record at a time (`async for`, or `getone()`), prints it, then
commits (`await consumer.commit()`, no offsets: what has been returned).
Prints one JSON line per event on stdout:
    {"event": "record", "partition": P, "offset": O}       (processed)
    {"event": "committed", "partition": P, "offset": O}    (commit returned)
    {"event": "stopped"}   after N records: it then waits to be killed,
                           holding whatever it fetched but did not return
"""

from __future__ import annotations

import argparse
import asyncio
import json

from tidelog import AsyncConsumer


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def main(args: argparse.Namespace) -> None:
    consumer = AsyncConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        enable_auto_commit=False,
        session_timeout_ms=3000,
        heartbeat_interval_ms=500,
    )
    await consumer.start()
    processed = 0

    async def handle(partition: int, offset: int) -> None:
        nonlocal processed
        emit("record", partition=partition, offset=offset)
        await consumer.commit()  # after processing: at-least-once
        emit("committed", partition=partition, offset=offset)
        processed += 1
        if processed == args.stop_after:
            emit("stopped")
            await asyncio.sleep(3600)  # until killed: no close, no leave

    if args.read == "iter":
        async for record in consumer:
            await handle(record.partition, record.offset)
    else:
        while True:
            record = await consumer.getone()
            await handle(record.partition, record.offset)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("group")
    parser.add_argument("topic")
    parser.add_argument("--read", choices=["iter", "getone"], required=True)
    parser.add_argument("--stop-after", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
