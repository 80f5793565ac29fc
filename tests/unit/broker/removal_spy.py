"""Which thread removes the directories of deleted logs: a spy on the real
`files.remove_renamed` (it still removes) for the tests that the broker's event
loop never does it (a multi-GB removal would stall every produce and fetch),
and which directories are still renamed aside (`renamed_aside`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tidelog_broker.log_manager as log_manager_module
from tidelog_broker.storage import files

#: Generous: a loaded 2-core CI machine.
GATE_WAIT_S = 30.0


@dataclass
class RemovalSpy:
    """Records each call's thread, directory name and result; a removal off
    `loop_thread` waits at `gate` (open unless a test closes it) before it
    removes. `entered` is set at the first call."""

    loop_thread: threading.Thread
    gate: threading.Event = field(default_factory=threading.Event)
    calls: list[tuple[threading.Thread, str, bool]] = field(default_factory=list)
    entered: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.gate.set()

    def wrap(self, real: Callable[[Path], bool]) -> Callable[[Path], bool]:
        def remove_renamed(directory: Path) -> bool:
            thread = threading.current_thread()
            self.entered.set()
            # Never waits on the loop's own thread: nothing would open it.
            if thread is not self.loop_thread:
                assert self.gate.wait(GATE_WAIT_S), "the gate stayed shut"
            removed = real(directory)
            self.calls.append((thread, directory.name, removed))
            return removed

        return remove_renamed

    def threads(self) -> set[str]:
        """The names of the threads that removed something."""
        return {thread.name for thread, _name, _removed in self.calls}

    def on(self, thread: threading.Thread) -> list[str]:
        """The directories removed on `thread`."""
        return [name for called_on, name, _removed in self.calls if called_on is thread]


def install(monkeypatch: pytest.MonkeyPatch) -> RemovalSpy:
    """Spy on every removal of this test; the calling thread is taken for
    the loop's (the tests run their loop with asyncio.run)."""
    spy = RemovalSpy(threading.current_thread())
    wrapped = spy.wrap(files.remove_renamed)
    # Both names: PartitionLog calls it through the module, the LogManager's
    # sweep through its own import.
    monkeypatch.setattr(files, "remove_renamed", wrapped)
    monkeypatch.setattr(log_manager_module, "remove_renamed", wrapped)
    return spy


def renamed_aside(data_dir: Path) -> list[str]:
    """The directories of `data_dir` renamed aside for deletion, not removed yet."""
    return sorted(p.name for p in data_dir.iterdir() if files.is_renamed_for_deletion(p.name))
