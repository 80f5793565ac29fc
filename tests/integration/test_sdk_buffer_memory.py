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
#: Batches of a few records, so that the buffer holds several.
BATCH_BYTES = 4096
#: How long a send waits for room before it fails (short: the test waits it out).
MAX_BLOCK_MS = 1500
#: Records of one send_batch call.
RECORDS_PER_CALL = 4
#: Sends that would fill the buffer ten times over: it must refuse before.
SENDS_MAX = 10 * BUFFER_BYTES // len(VALUE)
#: Generous: the acknowledgement of a record once the broker runs again.
ACK_DEADLINE_S = 60
NOW_MS = int(time.time() * 1000)


@pytest.mark.parametrize("way", ["send", "send_batch"])
def test_a_full_buffer_blocks_for_max_block_ms_then_sends_resume(tmp_path: Path, way: str) -> None:
    broker = start_broker(tmp_path / "broker")

    async def run() -> None:
        producer = AsyncProducer(
            broker.address,
            buffer_memory=BUFFER_BYTES,
            batch_size=BATCH_BYTES,
            max_block_ms=MAX_BLOCK_MS,
            linger_ms=0,
        )
        await producer.start()
        try:
            await producer.send(TOPIC, VALUE)  # metadata known before the stop
            os.kill(broker.pid, signal.SIGSTOP)
            try:
                with pytest.raises(TidelogTimeoutError, match="buffer_memory"):
                    for _ in range(SENDS_MAX):
                        if way == "send":
                            await producer.send(TOPIC, VALUE)
                        else:
                            await producer.send_batch(
                                TOPIC,
                                [VALUE] * RECORDS_PER_CALL,
                                timestamps=[NOW_MS] * RECORDS_PER_CALL,
                            )
            finally:
                os.kill(broker.pid, signal.SIGCONT)
            # Drained: the next send fits and is acknowledged.
            if way == "send":
                future = await producer.send(TOPIC, VALUE)
                await asyncio.wait_for(future, ACK_DEADLINE_S)
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
