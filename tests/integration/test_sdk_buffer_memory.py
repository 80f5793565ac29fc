"""A producer whose buffer_memory is full blocks send() for at most
max_block_ms, then fails naming the setting; once the sender drains, sends
go through again. Both ways in: send() per record and send_batch() columns.
The broker is SIGSTOPped so that nothing drains meanwhile."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from tidelog import AdminClient, AsyncProducer, NewTopic
from tidelog.errors import TidelogTimeoutError

from tests.support.processes import start_broker

pytestmark = pytest.mark.timeout(120)
TOPIC = "buffer-full"
VALUE = b"v" * 1000
#: Small enough that a few records fill it; larger than one record.
BUFFER_BYTES = 32 * 1024
NOW_MS = int(time.time() * 1000)


@pytest.mark.parametrize("way", ["send", "send_batch"])
def test_a_full_buffer_blocks_for_max_block_ms_then_sends_resume(tmp_path: Path, way: str) -> None:
    broker = start_broker(tmp_path / "broker")

    async def run() -> None:
        producer = AsyncProducer(
            broker.address,
            buffer_memory=BUFFER_BYTES,
            batch_size=4096,
            max_block_ms=1500,
            linger_ms=0,
        )
        await producer.start()
        try:
            await producer.send(TOPIC, VALUE)  # metadata known before the stop
            os.kill(broker.pid, signal.SIGSTOP)
            try:
                with pytest.raises(TidelogTimeoutError, match="buffer_memory"):
                    for _ in range(10 * BUFFER_BYTES // len(VALUE)):
                        if way == "send":
                            await producer.send(TOPIC, VALUE)
                        else:
                            await producer.send_batch(TOPIC, [VALUE] * 4, timestamps=[NOW_MS] * 4)
            finally:
                os.kill(broker.pid, signal.SIGCONT)
            # Drained: the next send fits and is acknowledged.
            if way == "send":
                future = await producer.send(TOPIC, VALUE)
                await asyncio.wait_for(future, 60)
            else:
                await producer.send_batch(TOPIC, [VALUE], timestamps=[NOW_MS])
            await producer.flush()
        finally:
            await producer.stop()

    try:
        with AdminClient(broker.address) as admin:
            admin.create_topics([NewTopic(TOPIC, 1, 1)])
        asyncio.run(run())
    finally:
        broker.stop()
