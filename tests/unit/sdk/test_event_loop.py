"""The blocking clients' loop implementation (tidelog._event_loop): uvloop when it can be
imported, asyncio's on request or when it cannot, and a clear error for a value it does not
know or for uvloop asked for and missing."""

from __future__ import annotations

import asyncio

import pytest
import uvloop
from tidelog._event_loop import EVENT_LOOP_ENV, new_event_loop

from tests.support.child_python import child_output


def _kind(loop: asyncio.AbstractEventLoop) -> str:
    try:
        return "uvloop" if isinstance(loop, uvloop.Loop) else "asyncio"
    finally:
        loop.close()


@pytest.mark.parametrize("value", [None, "auto", "", " UVLOOP ", "uvloop"])
def test_uvloop_by_default_and_on_request(value: str | None) -> None:
    environ = {} if value is None else {EVENT_LOOP_ENV: value}
    assert _kind(new_event_loop(environ)) == "uvloop"


def test_asyncio_on_request() -> None:
    loop = new_event_loop({EVENT_LOOP_ENV: "asyncio"})
    assert isinstance(loop, asyncio.BaseEventLoop)
    assert _kind(loop) == "asyncio"


def test_an_unknown_value_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"TIDELOG_EVENT_LOOP='trio' is not one of auto, asyncio"):
        new_event_loop({EVENT_LOOP_ENV: "trio"})


# A fresh interpreter in which `import uvloop` fails, as where it is not installed.
_WITHOUT_UVLOOP = """
import sys
sys.modules["uvloop"] = None
from tidelog._event_loop import new_event_loop
try:
    loop = new_event_loop()
except ValueError as exc:
    print("refused:", exc)
else:
    print(type(loop).__module__)
"""


def test_asyncio_when_uvloop_cannot_be_imported() -> None:
    assert child_output(_WITHOUT_UVLOOP, unset=EVENT_LOOP_ENV).startswith("asyncio")


def test_uvloop_asked_for_and_missing_is_refused_naming_the_package() -> None:
    out = child_output(_WITHOUT_UVLOOP, **{EVENT_LOOP_ENV: "uvloop"})
    assert out.startswith("refused: TIDELOG_EVENT_LOOP=uvloop but uvloop cannot be imported")
    assert "pip install 'tidelog[uvloop]'" in out
