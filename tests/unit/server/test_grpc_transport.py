"""tidelog_server.grpc_transport: every service switches gRPC's event-engine listener and
client off before gRPC is imported, unless the environment names them. Checked in child
processes where it matters: gRPC reads GRPC_EXPERIMENTS once per process, at its first import."""

from __future__ import annotations

import pytest
from tidelog_server.grpc_transport import GRPC_EXPERIMENTS, SERVICE_EXPERIMENTS, completed

from tests.support.child_python import child_output

_PRINT = "import os, sys; print(repr(os.environ.get('GRPC_EXPERIMENTS')), 'grpc' in sys.modules)"
_BOTH_OFF = ",".join(SERVICE_EXPERIMENTS)


def _child(code: str, **env: str) -> str:
    return child_output(code, unset=GRPC_EXPERIMENTS, **env)


@pytest.mark.parametrize("service", ["tidelog_broker", "tidelog_coordinator", "tidelog_gateway"])
def test_each_service_chooses_before_grpc_is_imported(service: str) -> None:
    # What the console scripts do (`from tidelog_broker.__main__ import main`): the choice is
    # made, and gRPC, which the module's other imports bring in, comes after it.
    assert _child(f"import {service}.__main__; {_PRINT}") == f"{_BOTH_OFF!r} True"


def test_a_service_started_by_an_sdk_process_still_gets_the_listener_off() -> None:
    # A parent that imported tidelog passes its client choice on; the listener is added.
    printed = _child(
        f"import tidelog_broker.__main__; {_PRINT}", GRPC_EXPERIMENTS="-event_engine_client"
    )
    assert printed == "'-event_engine_client,-event_engine_listener' True"


@pytest.mark.parametrize(
    ("chosen", "result"),
    [
        ("", _BOTH_OFF),
        ("event_engine_listener", "event_engine_listener,-event_engine_client"),
        ("event_engine_listener,event_engine_client", "event_engine_listener,event_engine_client"),
        ("-event_engine_dns", f"-event_engine_dns,{_BOTH_OFF}"),
    ],
)
def test_what_the_environment_names_is_kept(chosen: str, result: str) -> None:
    assert completed(chosen) == result


def test_nothing_is_set_once_grpc_was_imported() -> None:
    # Too late for gRPC to read it: setting it would only mislead.
    code = f"import grpc; from tidelog_server import grpc_transport; {_PRINT}"
    assert _child(code) == "None True"
