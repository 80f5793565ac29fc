"""Reading a topic back in the Spark tests: every record up to the end
offsets taken when the read starts (tests.support.read_to_end)."""

from __future__ import annotations

from tidelog import ConsumerRecord

from tests.support.read_to_end import batches_to_end

#: How long a read back may take before it fails, naming how far it got.
READ_S = 60


def read_topic(
    bootstrap: str, topic: str, partitions: int, timeout_s: float = READ_S
) -> list[ConsumerRecord]:
    """Every record of `topic`, partition by partition in offset order."""
    records: dict[int, list[ConsumerRecord]] = {p: [] for p in range(partitions)}
    for partition, batch in batches_to_end(bootstrap, topic, partitions, timeout_s):
        records[partition].extend(batch)
    return [record for p in range(partitions) for record in records[p]]
