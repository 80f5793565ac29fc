"""Compression per codec on realistic events: ratio, produce and consume throughput.

``python -m bench.compression_bench [--records 200000] [--codec-only]``

The payload is JSON-like events as an analytics pipeline sends them
(generated, seeded): a user id, an event type from a small vocabulary, an ISO
timestamp, a session id, a URL path, and a small nested object of
device/geo fields; ~250-350 bytes each, keyed by user id.

Per codec (none, gzip, snappy, lz4, zstd), through the SDK against a real
broker (one synchronous `Producer`, acks=1, default batch size and linger;
one `Consumer` reading the topic back from the beginning): produce MB/s and
records/s (uncompressed bytes, counted when every send is acknowledged),
consume MB/s, and the ratio of uncompressed to stored bytes (the partition's
size on disk as DescribeTopics reports it, indexes included). The codec alone
(encode_batch/decode_batches of 256 KB batches) is measured first and says
so; --codec-only stops there.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tidelog.compression import CompressionType  # noqa: E402
from tidelog.records import decode_batches, encode_batch  # noqa: E402

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
EVENT_TYPES = ["page_view", "click", "add_to_cart", "purchase", "search", "login", "logout"]
PATHS = ["/", "/products", "/products/%d", "/cart", "/checkout", "/search?q=%s", "/account"]
COUNTRIES = ["US", "DE", "FR", "GB", "IN", "BR", "JP", "NL", "SE", "ES"]
DEVICES = ["ios", "android", "web-chrome", "web-safari", "web-firefox"]
WORDS = ["shoes", "laptop", "coffee", "desk", "lamp", "phone", "case", "book", "chair"]


def make_events(count: int, seed: int = 7) -> list[tuple[bytes, bytes]]:
    """(key, value) pairs: JSON events keyed by user id."""
    rng = random.Random(seed)
    base_ms = 1_795_000_000_000
    out = []
    for i in range(count):
        user = rng.randrange(50_000)
        kind = rng.choice(EVENT_TYPES)
        path = rng.choice(PATHS)
        if "%d" in path:
            path = path % rng.randrange(10_000)
        elif "%s" in path:
            path = path % rng.choice(WORDS)
        ts_ms = base_ms + i * 7 + rng.randrange(5)
        event = {
            "user_id": f"u-{user:06d}",
            "event": kind,
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts_ms / 1000))
            + f".{ts_ms % 1000:03d}Z",
            "session": f"s-{rng.getrandbits(48):012x}",
            "path": path,
            "device": {
                "os": rng.choice(DEVICES),
                "app_version": f"4.{rng.randrange(20)}.{rng.randrange(9)}",
            },
            "geo": {"country": rng.choice(COUNTRIES), "city_id": rng.randrange(2000)},
            "props": {"value_cents": rng.randrange(100_000)} if kind == "purchase" else {},
        }
        key = f"u-{user:06d}".encode()
        out.append((key, json.dumps(event, separators=(",", ":")).encode()))
    return out


def codec_only(events: list[tuple[bytes, bytes]]) -> None:
    raw_bytes = sum(len(k) + len(v) for k, v in events)
    per_batch = max(1, 256 * 1024 // (raw_bytes // len(events)))
    print(
        f"codec only (encode_batch / decode_batches, {per_batch} records per batch, "
        f"{raw_bytes / 1e6:.1f} MB uncompressed) -- no broker involved"
    )
    print(f"{'codec':8} {'ratio':>6} {'encode MB/s':>12} {'decode MB/s':>12}")
    for name in CODECS:
        codec = CompressionType.parse(name)
        chunks = [events[i : i + per_batch] for i in range(0, len(events), per_batch)]
        t0 = time.perf_counter()
        batches = [
            encode_batch([v for _, v in c], keys=[k for k, _ in c], codec=codec) for c in chunks
        ]
        encode_s = time.perf_counter() - t0
        blob = b"".join(batches)
        t0 = time.perf_counter()
        count = sum(len(b.values) for b in decode_batches(blob))
        decode_s = time.perf_counter() - t0
        assert count == len(events)
        print(
            f"{name:8} {raw_bytes / len(blob):6.2f} {raw_bytes / encode_s / 1e6:12.1f} "
            f"{raw_bytes / decode_s / 1e6:12.1f}"
        )


def through_broker(events: list[tuple[bytes, bytes]]) -> None:
    from tidelog.admin import AdminClient
    from tidelog.consumer import Consumer
    from tidelog.producer import Producer
    from tidelog.types import NewTopic, TopicPartition

    from bench._processes import tidelog_broker

    raw_bytes = sum(len(k) + len(v) for k, v in events)
    print(
        f"through the SDK against a real broker: {len(events)} events, "
        f"{raw_bytes / 1e6:.1f} MB uncompressed, avg {raw_bytes / len(events):.0f} B"
    )
    print(
        f"{'codec':8} {'ratio':>6} {'stored MB':>10} {'produce MB/s':>13} {'rec/s':>9} "
        f"{'consume MB/s':>13} {'rec/s':>9}"
    )
    with tidelog_broker() as broker:
        for name in CODECS:
            topic = f"events-{name}"
            with AdminClient(bootstrap_servers=broker.address) as admin:
                admin.create_topics([NewTopic(topic, num_partitions=1)])
            with Producer(bootstrap_servers=broker.address, compression_type=name) as producer:
                t0 = time.perf_counter()
                for key, value in events:
                    producer.send(topic, value, key=key, partition=0)
                producer.flush()
                produce_s = time.perf_counter() - t0
            with AdminClient(bootstrap_servers=broker.address) as admin:
                (description,) = admin.describe_topics([topic])
            stored = description.partitions[0].size_bytes
            with Consumer(
                bootstrap_servers=broker.address,
                auto_offset_reset="earliest",
                consumer_timeout_ms=10_000,
            ) as consumer:
                consumer.assign([TopicPartition(topic, 0)])
                t0 = time.perf_counter()
                seen = 0
                for _ in consumer:
                    seen += 1
                    if seen == len(events):
                        break
                consume_s = time.perf_counter() - t0
            assert seen == len(events), f"{name}: consumed {seen} of {len(events)}"
            print(
                f"{name:8} {raw_bytes / stored:6.2f} {stored / 1e6:10.1f} "
                f"{raw_bytes / produce_s / 1e6:13.1f} {len(events) / produce_s:9.0f} "
                f"{raw_bytes / consume_s / 1e6:13.1f} {len(events) / consume_s:9.0f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--codec-only", action="store_true", help="skip the broker")
    args = parser.parse_args()
    events = make_events(args.records)
    codec_only(events)
    if not args.codec_only:
        print()
        try:
            through_broker(events)
        except ImportError as exc:
            print(f"the SDK producer/consumer is not importable ({exc}): codec numbers only")


if __name__ == "__main__":
    main()
