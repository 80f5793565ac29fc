# Types of the optional C extension (sdk/tidelog/_crecords.c).
from typing import Any, TypeVar

_R = TypeVar("_R", bound=tuple[Any, ...])

def build_records(
    record_type: type[_R],
    topic: str,
    partition: int,
    timestamp_type: int,
    leader_epoch: int,
    blob: Any,
    payload_pos: int,
    base_offset: int,
    deltas: Any,
    timestamps: Any,
    timestamp: int,
    key_lengths: Any,
    value_lengths: Any,
    headers: list[Any] | None,
    no_headers: Any,
    start: int,
) -> list[_R]: ...
def arrow_columns(
    bodies: list[Any], batches: list[tuple[int, int, int, int, bool]]
) -> tuple[
    int,
    str | None,
    int,
    bytes,
    bytes,
    bytes,
    bytes | None,
    int,
    bytes,
    bytes | None,
    int,
    list[tuple[int, int, int, int]],
]: ...
def export_struct(
    length: int, columns: list[tuple[int, int, int, tuple[Any, ...]]]
) -> tuple[object, int]: ...
def check_header_blocks(
    blocks: Any, lengths: Any, check_utf8: bool
) -> tuple[str, str] | tuple[str, int, int] | None: ...
def first_at_or_after(timestamps: Any, target: int) -> int: ...
def keep_freed_arenas(max_bytes: int) -> int: ...
