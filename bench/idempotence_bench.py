"""What idempotence costs a producer: records/s with acks=all, without and with it.

One standalone broker, one synchronous Producer per round, 100-byte keyless
values, default batching; the two modes alternate for `--rounds` rounds in
the same run (the machine is noisy: compare the medians, not one round).
With idempotence the producer also sends at most one batch per partition per
request and the broker checks sequences on every append.

    .venv/bin/python bench/idempotence_bench.py [--records 500000] [--partitions 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

from _processes import tidelog_broker
from tidelog import AdminClient, NewTopic, Producer


def produce(address: str, topic: str, records: int, idempotent: bool) -> float:
    value = b"x" * 100
    with Producer(address, acks="all", enable_idempotence=idempotent) as producer:
        producer.send(topic, value).get(30)  # connect and take a producer id first
        start = time.perf_counter()
        send = producer.send
        for _ in range(records):
            send(topic, value)
        producer.flush(120)
        return records / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates: dict[bool, list[float]] = {False: [], True: []}
    with tidelog_broker() as broker:
        for round_ in range(args.rounds):
            for idempotent in (False, True):
                topic = f"bench-{round_}-{int(idempotent)}"
                with AdminClient(broker.address) as admin:
                    admin.create_topics([NewTopic(topic, num_partitions=args.partitions)])
                rate = produce(broker.address, topic, args.records, idempotent)
                rates[idempotent].append(rate)
                mode = "on " if idempotent else "off"
                print(f"round {round_}: idempotence {mode} {rate:,.0f} rec/s")
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    print(
        f"median acks=all: {off:,.0f} rec/s without idempotence, {on:,.0f} with "
        f"({(on / off - 1) * 100:+.1f} %)"
    )


if __name__ == "__main__":
    main()
