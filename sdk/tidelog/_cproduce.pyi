# Types of the optional C extension (sdk/tidelog/_cproduce.c).
from typing import Any

class Lane:
    used: int
    room: int
    closed: bool
    def __init__(
        self,
        values: list[Any],
        timestamps: list[int],
        result: Any,
        future_type: type[tuple[Any, int]],
        room: int,
        max_record: int,
        overhead: int,
    ) -> None: ...
    def append(self, value: object) -> Any: ...
    def close(self) -> int: ...
