"""enable_idempotence: on by default with acks=all, and Kafka's rules."""

from __future__ import annotations

import pytest
from tidelog import ProducerConfig
from tidelog._idempotence import SEQUENCE_MAX, increment_sequence

pytestmark = pytest.mark.timeout(10)


def test_idempotence_follows_acks_by_default() -> None:
    assert not ProducerConfig().idempotent  # our default acks is 1
    assert ProducerConfig(acks="all").idempotent
    assert ProducerConfig(acks=-1).idempotent
    assert not ProducerConfig(acks="all", enable_idempotence=False).idempotent
    # A default that the other settings contradict is simply off.
    assert not ProducerConfig(acks="all", max_in_flight_requests=6).idempotent


@pytest.mark.parametrize(
    ("options", "needs"),
    [
        ({"acks": 1}, "acks='all'"),
        ({"acks": "all", "retries": 0}, "retries > 0"),
        ({"acks": "all", "max_in_flight_requests": 6}, "max_in_flight_requests <= 5"),
    ],
)
def test_explicit_idempotence_checks_its_requirements(
    options: dict[str, object], needs: str
) -> None:
    with pytest.raises(ValueError, match=needs):
        ProducerConfig(enable_idempotence=True, **options)  # type: ignore[arg-type]


def test_producer_key_needs_idempotence() -> None:
    assert ProducerConfig(acks="all", producer_key="writer-1").producer_key == "writer-1"
    with pytest.raises(ValueError, match="producer_key"):
        ProducerConfig(producer_key="writer-1")
    with pytest.raises(ValueError, match="producer_key"):
        ProducerConfig(acks="all", producer_key="")


def test_sequences_wrap_like_the_broker() -> None:
    assert increment_sequence(SEQUENCE_MAX, 1) == 0
    assert increment_sequence(SEQUENCE_MAX - 2, 5) == 2
