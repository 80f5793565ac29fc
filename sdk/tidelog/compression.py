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
"""

from __future__ import annotations

import enum
import importlib
import zlib
from collections.abc import Callable
from types import ModuleType

from tidelog.errors import InvalidRecordError, UnsupportedCodecError


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

#: The extra (`pip install 'tidelog[<extra>]'`) and the library of each optional codec.
_EXTRAS: dict[CompressionType, tuple[str, str]] = {
    CompressionType.SNAPPY: ("snappy", "cramjam"),
    CompressionType.LZ4: ("lz4", "lz4"),
    CompressionType.ZSTD: ("zstd", "zstandard"),
}


def _gzip_compress(data: bytes) -> bytes:
    compressor = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


def _gzip_decompress(data: bytes) -> bytes:
    return zlib.decompress(data, 16 + zlib.MAX_WBITS)


# Only the codecs whose library is installed: the others are reported by
# require_available.
_COMPRESS: dict[CompressionType, Callable[[bytes], bytes]] = {
    CompressionType.GZIP: _gzip_compress,
}
_DECOMPRESS: dict[CompressionType, Callable[[bytes], bytes]] = {
    CompressionType.GZIP: _gzip_decompress,
}
if cramjam is not None:
    _snappy = cramjam.snappy
    _COMPRESS[CompressionType.SNAPPY] = lambda data: bytes(_snappy.compress_raw(data))
    _DECOMPRESS[CompressionType.SNAPPY] = lambda data: bytes(_snappy.decompress_raw(data))
if lz4_frame is not None:
    _COMPRESS[CompressionType.LZ4] = lz4_frame.compress
    _DECOMPRESS[CompressionType.LZ4] = lz4_frame.decompress
if zstandard is not None:
    _COMPRESS[CompressionType.ZSTD] = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress
    _DECOMPRESS[CompressionType.ZSTD] = zstandard.ZstdDecompressor().decompress


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


def decompress(codec: int, data: bytes) -> bytes:
    """Decompress a batch body; raise InvalidRecordError when it is not valid."""
    if codec == CompressionType.NONE:
        return data
    try:
        fn = _DECOMPRESS[require_available(CompressionType(codec))]
    except ValueError:
        raise InvalidRecordError(f"unknown compression codec {codec} in batch attributes") from None
    try:
        return fn(data)
    except Exception as exc:  # each library raises its own types
        raise InvalidRecordError(
            f"cannot decompress a {CompressionType(codec).name.lower()} batch body: {exc}"
        ) from exc
