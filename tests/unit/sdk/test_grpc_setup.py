"""tidelog._grpc_setup: importing tidelog picks gRPC's long-standing client transport
(GRPC_EXPERIMENTS=-event_engine_client) unless the application chose one, or imported gRPC
first. In child processes: gRPC reads the variable once per process, when first imported."""

from __future__ import annotations

import pytest
from tidelog._grpc_setup import DEFAULT_EXPERIMENTS, GRPC_EXPERIMENTS, choose_transport

from tests.support.child_python import child_output

_PRINT = "import os; print(repr(os.environ.get('GRPC_EXPERIMENTS')))"


def _child(code: str, **env: str) -> str:
    return child_output(code, unset=GRPC_EXPERIMENTS, **env)


def test_importing_tidelog_first_switches_the_event_engine_client_off() -> None:
    assert _child(f"import tidelog; {_PRINT}") == repr(DEFAULT_EXPERIMENTS)
    # Also through a submodule (the broker imports tidelog.v1 and tidelog.errors).
    assert _child(f"import tidelog.errors; {_PRINT}") == repr(DEFAULT_EXPERIMENTS)


@pytest.mark.parametrize("chosen", ["", "-event_engine_dns"])
def test_the_applications_own_choice_is_kept(chosen: str) -> None:
    assert _child(f"import tidelog; {_PRINT}", GRPC_EXPERIMENTS=chosen) == repr(chosen)


def test_nothing_is_set_once_grpc_was_imported() -> None:
    # Too late for gRPC to read it: setting it would only mislead.
    assert _child(f"import grpc, tidelog; {_PRINT}") == "None"


def test_choose_transport_on_a_given_environment() -> None:
    # This process has imported grpc already: only an explicit check of the rule.
    environ: dict[str, str] = {}
    assert choose_transport(environ) is False and environ == {}
