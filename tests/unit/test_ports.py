"""tests/support/ports: whether the port that answered is ours (listens_on), and
where a dev cluster's run of ports comes from (free_ports_in_a_row)."""

from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path

import pytest

from tests.support.ports import (
    EPHEMERAL_RANGE_FILE,
    free_port,
    free_ports_in_a_row,
    listens_on,
)


def test_listens_on_tells_our_listening_socket_from_a_port_we_do_not_listen_on() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert listens_on(os.getpid(), port)
        assert not listens_on(os.getpid(), free_port())
    assert not listens_on(os.getpid(), port)  # closed


def test_a_run_of_ports_is_below_the_ephemeral_range_in_this_workers_slice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # free_port() and every outgoing connection take ephemeral ports: a run
    # of ports from there was taken under a dev cluster's gateway in CI.
    ephemeral_start = int(Path(EPHEMERAL_RANGE_FILE).read_text().split()[0])
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    slices = []
    for worker in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        bases = [free_ports_in_a_row(3) for _ in range(20)]
        assert all(base + 3 <= ephemeral_start for base in bases)
        slices.append((min(bases), max(bases)))
    for (_, last), (first, _) in itertools.pairwise(slices):
        assert last < first  # the workers' picks never meet
