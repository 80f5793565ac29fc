"""`tidelog-gateway --producer-request-timeout-ms` and `--forward-timeout-s`:
reach the config, and a value the gateway could not run with is refused at
start."""

from __future__ import annotations

import pytest
from tidelog import ProducerConfig
from tidelog_gateway.__main__ import MAX_PRODUCER_REQUEST_TIMEOUT_MS, parse_all

pytestmark = pytest.mark.timeout(30)


def test_producer_request_timeout_reaches_the_config() -> None:
    config, _ = parse_all(["--producer-request-timeout-ms", "500"])
    assert config.producer_request_timeout_ms == 500
    assert parse_all([])[0].producer_request_timeout_ms == 30_000


def test_a_producer_request_timeout_over_the_delivery_timeout_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The largest value still makes a valid producer (as records_servicer builds it).
    ProducerConfig(linger_ms=2, request_timeout_ms=MAX_PRODUCER_REQUEST_TIMEOUT_MS)
    with pytest.raises(SystemExit):
        parse_all(["--producer-request-timeout-ms", str(MAX_PRODUCER_REQUEST_TIMEOUT_MS + 1)])
    assert "--producer-request-timeout-ms must be at most" in capsys.readouterr().err


def test_forward_timeout_reaches_the_config() -> None:
    assert parse_all(["--forward-timeout-s", "2.5"])[0].forward_timeout_s == 2.5
    assert parse_all([])[0].forward_timeout_s == 30.0


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_forward_timeout_that_is_not_a_positive_time_is_refused(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_all(["--forward-timeout-s", value])
    assert "--forward-timeout-s: must be a positive number of seconds" in capsys.readouterr().err
