"""A stand-in C library for the mallopt tests of the broker and the SDK."""

from __future__ import annotations

from typing import Any


class RecordingLibc:
    """Records mallopt calls, accepts (1) or refuses (0) them."""

    def __init__(self, result: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.result = result

    def mallopt(self, param: Any, value: Any) -> int:
        self.calls.append((param.value, value.value))
        return self.result
