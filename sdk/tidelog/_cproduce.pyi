# Types of the optional C extension (sdk/tidelog/_cproduce.c).
from collections.abc import Callable
from typing import Any

class Lane:
    used: int
    room: int
    closed: bool
    keyed: bool
    keyless: bool
    with_headers: bool
    def __init__(
        self,
        values: list[Any],
        timestamps: list[int],
        result: Any,
        future_type: type[tuple[Any, int]],
        room: int,
        max_record: int,
        overhead: int,
        on_full: Callable[[Lane], object] | None = None,
        keys: list[Any] | None = None,
        headers: list[Any] | None = None,
        keyless: bool | None = None,
    ) -> None: ...
    def append(self, value: object, headers: object = None) -> Any: ...
    def append_keyed(self, key: object, value: object, headers: object = None) -> Any: ...
    def close(self) -> int: ...

def plain_body(values: list[Any], timestamps: list[int] | None) -> bytes | None: ...
def header_blocks(headers: list[Any]) -> tuple[bytes, bytes] | None: ...
def murmur2(data: bytes) -> int: ...
def partition_for_key(key: bytes, partition_count: int) -> int: ...
def keyed_append(
    table: list[Lane | None],
    partition_count: object,
    key: object,
    value: object,
    headers: object = None,
) -> Any: ...
