"""Compression codecs for record batch bodies.

A batch body is compressed as a whole; the codec is stored in the low three
bits of the batch attributes, numbered as in Apache Kafka so the meaning of a
number never changes: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.

- gzip: the standard library's zlib with a gzip wrapper (level 6, Kafka's
  default level).
- snappy: raw snappy blocks (cramjam), no framing: the batch header already
  carries the length and the checksum.
- lz4: the LZ4 frame format (python-lz4).
- zstd: a zstd frame with its content size (zstandard).

gzip is always there; the libraries of the other three are optional, installed
by the extras `tidelog[snappy]`, `tidelog[lz4]`, `tidelog[zstd]` (or
`tidelog[all]`). Naming a codec whose library is missing, or reading a batch
compressed with it, raises UnsupportedCodecError naming the extra to install.

Decompression is bounded: every decompressor stops one byte past the
caller's limit on the uncompressed size (a broker passes the topic's
max.message.bytes, a consumer its fetch_max_bytes), so a small body that
expands to gigabytes (a decompression bomb) costs at most the limit.
Trailing bytes after a stream are an error, so that a body decodes one way.
"""

from __future__ import annotations

import enum
import importlib
import zlib
from collections.abc import Callable
from types import ModuleType

from tidelog.errors import InvalidRecordError, MessageTooLargeError, UnsupportedCodecError


def _optional(module: str) -> ModuleType | None:
    """The codec library `module`, or None when its extra is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


cramjam = _optional("cramjam")
lz4_frame = _optional("lz4.frame")
zstandard = _optional("zstandard")


class CompressionType(enum.IntEnum):
    """The codec of a batch body; the value is what the attributes store."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def parse(cls, name: str | int | CompressionType | None) -> CompressionType:
        """Accept what users write: None, "none", "gzip", "snappy", "lz4", "zstd"."""
        if name is None:
            return cls.NONE
        if isinstance(name, int):
            return require_available(cls(name))
        try:
            codec = cls[name.strip().upper()]
        except KeyError:
            accepted = ", ".join(c.name.lower() for c in cls)
            raise UnsupportedCodecError(
                f"unknown compression type {name!r}; use one of {accepted}"
            ) from None
        return require_available(codec)


CODEC_MASK = 0x07

# Levels chosen for throughput on a producer's hot path, as Kafka's defaults are.
_GZIP_LEVEL = 6
_ZSTD_LEVEL = 3

#: Bound on a body's uncompressed size when the caller names none (tools and
#: tests; the broker and the consumer always pass their own limit).
DEFAULT_MAX_UNCOMPRESSED_BYTES = 256 * 1024 * 1024
# Output measured per step when a zstd frame does not declare its size.
_STREAM_CHUNK_BYTES = 1024 * 1024

#: The extra (`pip install 'tidelog[<extra>]'`) and the library of each optional codec.
_EXTRAS: dict[CompressionType, tuple[str, str]] = {
    CompressionType.SNAPPY: ("snappy", "cramjam"),
    CompressionType.LZ4: ("lz4", "lz4"),
    CompressionType.ZSTD: ("zstd", "zstandard"),
}


def _gzip_compress(data: bytes) -> bytes:
    compressor = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


def _too_large(codec: str, limit: int) -> MessageTooLargeError:
    return MessageTooLargeError(
        f"{codec} batch body decompresses to more than {limit} bytes, the limit on a "
        "batch's uncompressed size (max.message.bytes on a broker, fetch_max_bytes in "
        "a consumer)"
    )


def _gzip_decompress(data: bytes | memoryview, limit: int) -> bytes:
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    # max_length stops the output one byte past the limit, whatever the input
    # claims: a decompression bomb never gets to allocate its full size.
    out = decompressor.decompress(data, limit + 1)
    if len(out) > limit:
        raise _too_large("gzip", limit)
    if not decompressor.eof:
        raise ValueError("truncated gzip stream")
    if decompressor.unused_data:
        raise ValueError(f"{len(decompressor.unused_data)} bytes after the gzip stream")
    return out


# Only the codecs whose library is installed: the others are reported by
# require_available.
_COMPRESS: dict[CompressionType, Callable[[bytes], bytes]] = {
    CompressionType.GZIP: _gzip_compress,
}
_DECOMPRESS: dict[CompressionType, Callable[[bytes | memoryview, int], bytes]] = {
    CompressionType.GZIP: _gzip_decompress,
}
if cramjam is not None:
    _snappy = cramjam.snappy

    def _snappy_decompress(data: bytes | memoryview, limit: int) -> bytes:
        # A raw snappy block starts with its uncompressed length, and the
        # decompressor allocates exactly that (and fails if the data disagree).
        if _snappy.decompress_raw_len(data) > limit:
            raise _too_large("snappy", limit)
        return bytes(_snappy.decompress_raw(data))

    _COMPRESS[CompressionType.SNAPPY] = lambda data: bytes(_snappy.compress_raw(data))
    _DECOMPRESS[CompressionType.SNAPPY] = _snappy_decompress
if lz4_frame is not None:
    _lz4_frame = lz4_frame

    def _lz4_decompress(data: bytes | memoryview, limit: int) -> bytes:
        decompressor = _lz4_frame.LZ4FrameDecompressor()
        out = decompressor.decompress(data, max_length=limit + 1)
        if len(out) > limit:
            raise _too_large("lz4", limit)
        if not decompressor.eof:
            raise ValueError("truncated lz4 frame")
        if decompressor.unused_data:
            raise ValueError(f"{len(decompressor.unused_data)} bytes after the lz4 frame")
        return bytes(out)

    _COMPRESS[CompressionType.LZ4] = _lz4_frame.compress
    _DECOMPRESS[CompressionType.LZ4] = _lz4_decompress
if zstandard is not None:
    _zstandard = zstandard
    _zstd_decompressor = zstandard.ZstdDecompressor()

    def _zstd_decompress(data: bytes | memoryview, limit: int) -> bytes:
        content_size = _zstandard.frame_content_size(data)
        if content_size > limit:
            raise _too_large("zstd", limit)
        if content_size < 0:
            # No size in the frame header (our producer always writes one):
            # measure the output in bounded chunks before decompressing it whole.
            produced = 0
            with _zstd_decompressor.stream_reader(data) as reader:
                while chunk := reader.read(min(_STREAM_CHUNK_BYTES, limit + 1 - produced)):
                    produced += len(chunk)
                    if produced > limit:
                        raise _too_large("zstd", limit)
            content_size = produced
        return _zstd_decompressor.decompress(
            data, max_output_size=max(content_size, 1), allow_extra_data=False
        )

    _COMPRESS[CompressionType.ZSTD] = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress
    _DECOMPRESS[CompressionType.ZSTD] = _zstd_decompress


def require_available(codec: CompressionType) -> CompressionType:
    """`codec`, or UnsupportedCodecError naming the extra that installs its library."""
    if codec != CompressionType.NONE and codec not in _COMPRESS:
        extra, library = _EXTRAS[codec]
        raise UnsupportedCodecError(
            f"{codec.name.lower()} compression needs the {library!r} package, which is not "
            f"installed: pip install 'tidelog[{extra}]' (or 'tidelog[all]')"
        )
    return codec


def compress(codec: CompressionType, data: bytes) -> bytes:
    """Compress a batch body with `codec` (NONE returns `data` unchanged)."""
    if codec == CompressionType.NONE:
        return data
    return _COMPRESS[require_available(codec)](data)


def decompress(
    codec: int, data: bytes | memoryview, max_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES
) -> bytes | memoryview:
    """Decompress a batch body; raise InvalidRecordError when it is not valid
    and MessageTooLargeError when it would exceed `max_bytes` (checked while
    decompressing, so a small bomb never expands past the limit)."""
    if codec == CompressionType.NONE:
        if len(data) > max_bytes:
            raise MessageTooLargeError(
                f"batch body of {len(data)} bytes is larger than the limit of {max_bytes}"
            )
        return data
    try:
        fn = _DECOMPRESS[require_available(CompressionType(codec))]
    except ValueError:
        raise InvalidRecordError(f"unknown compression codec {codec} in batch attributes") from None
    try:
        return fn(data, max_bytes)
    except MessageTooLargeError:
        raise
    except Exception as exc:  # each library raises its own types
        raise InvalidRecordError(
            f"cannot decompress a {CompressionType(codec).name.lower()} batch body: {exc}"
        ) from exc
