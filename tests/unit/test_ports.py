"""tests/support/ports.listens_on: whether the port that answered is ours."""

from __future__ import annotations

import os
import socket

from tests.support.ports import free_port, listens_on


def test_listens_on_tells_our_listening_socket_from_a_port_we_do_not_listen_on() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert listens_on(os.getpid(), port)
        assert not listens_on(os.getpid(), free_port())
    assert not listens_on(os.getpid(), port)  # closed
