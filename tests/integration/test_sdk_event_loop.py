"""The blocking clients work on either loop implementation (tidelog._event_loop): in a fresh
process per choice (the shared loop thread's loop is made once per process), a Producer, a
Consumer and an AdminClient create a topic, produce, read back and list offsets through a real
broker, and report which loop their thread ran."""

from __future__ import annotations

import json

import pytest
from tidelog._event_loop import EVENT_LOOP_ENV

from tests.support.child_python import child_output

pytestmark = pytest.mark.timeout(150)

_ROUND_TRIP = """
import json, sys, uvloop
from tidelog import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tidelog._loop_thread import client_loop

address, topic = sys.argv[1], sys.argv[2]
with AdminClient(address) as admin:
    admin.create_topics([NewTopic(topic, num_partitions=2)])
with Producer(bootstrap_servers=address, acks="all") as producer:
    futures = [producer.send(topic, key=b"k%d" % i, value=b"v%d" % i) for i in range(200)]
    producer.flush()
    offsets = sorted((f.get(30).partition, f.get(30).offset) for f in futures)
got = []
with Consumer(bootstrap_servers=address, auto_offset_reset="earliest") as consumer:
    consumer.assign([TopicPartition(topic, p) for p in (0, 1)])
    while len(got) < 200:
        for records in consumer.poll(timeout_ms=30_000).values():
            got.extend(r.value for r in records)
    ends = consumer.end_offsets([TopicPartition(topic, p) for p in (0, 1)])
handle = client_loop("probe", shared=True)
try:
    kind = "uvloop" if isinstance(handle.loop, uvloop.Loop) else type(handle.loop).__module__
finally:
    handle.stop()
print(json.dumps({"loop": kind, "values": sorted(v.decode() for v in got),
                  "offsets": len(offsets), "ends": sum(ends.values())}))
"""


@pytest.mark.parametrize(("choice", "loop"), [("auto", "uvloop"), ("asyncio", "asyncio")])
def test_the_blocking_clients_on_each_loop(
    broker_address: str, topic_name: str, choice: str, loop: str
) -> None:
    out = child_output(
        _ROUND_TRIP.replace("sys.argv[1], sys.argv[2]", repr((broker_address, topic_name))),
        **{EVENT_LOOP_ENV: choice},
    )
    result = json.loads(out.splitlines()[-1])
    assert result["loop"].startswith(loop), result["loop"]
    assert result["values"] == sorted(f"v{i}" for i in range(200))
    assert result["offsets"] == 200
    assert result["ends"] == 200
