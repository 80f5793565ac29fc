"""`grpc_channel_options`: extra gRPC channel arguments after the client's own
(the gateway uses one of its own to spread its consumers over several
connections per broker)."""

from __future__ import annotations

from tidelog._connection import channel_options
from tidelog.config import ConsumerConfig, ProducerConfig


def test_extra_channel_options_follow_the_clients_own() -> None:
    plain = channel_options(ConsumerConfig(bootstrap_servers="127.0.0.1:1"))
    config = ConsumerConfig(
        bootstrap_servers="127.0.0.1:1", grpc_channel_options=[("tidelog.test.connection", 3)]
    )
    assert config.grpc_channel_options == (("tidelog.test.connection", 3),)
    assert channel_options(config) == [*plain, ("tidelog.test.connection", 3)]
    # Every client has the option; none by default.
    assert ProducerConfig(bootstrap_servers="127.0.0.1:1").grpc_channel_options == ()
