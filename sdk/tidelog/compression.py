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
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Callable

import cramjam
import lz4.frame
import zstandard

from tidelog.errors import InvalidRecordError, UnsupportedCodecError


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
            return cls(name)
        try:
            return cls[name.strip().upper()]
        except KeyError:
            accepted = ", ".join(c.name.lower() for c in cls)
            raise UnsupportedCodecError(
                f"unknown compression type {name!r}; use one of {accepted}"
            ) from None


CODEC_MASK = 0x07

# Levels chosen for throughput on a producer's hot path, as Kafka's defaults are.
_GZIP_LEVEL = 6
_ZSTD_LEVEL = 3

_zstd_compressor = zstandard.ZstdCompressor(level=_ZSTD_LEVEL)
_zstd_decompressor = zstandard.ZstdDecompressor()


def _gzip_compress(data: bytes) -> bytes:
    compressor = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


def _gzip_decompress(data: bytes) -> bytes:
    return zlib.decompress(data, 16 + zlib.MAX_WBITS)


_COMPRESS: dict[CompressionType, Callable[[bytes], bytes]] = {
    CompressionType.GZIP: _gzip_compress,
    CompressionType.SNAPPY: lambda data: bytes(cramjam.snappy.compress_raw(data)),
    CompressionType.LZ4: lambda data: lz4.frame.compress(data),
    CompressionType.ZSTD: _zstd_compressor.compress,
}

_DECOMPRESS: dict[CompressionType, Callable[[bytes], bytes]] = {
    CompressionType.GZIP: _gzip_decompress,
    CompressionType.SNAPPY: lambda data: bytes(cramjam.snappy.decompress_raw(data)),
    CompressionType.LZ4: lambda data: lz4.frame.decompress(data),
    CompressionType.ZSTD: _zstd_decompressor.decompress,
}


def compress(codec: CompressionType, data: bytes) -> bytes:
    """Compress a batch body with `codec` (NONE returns `data` unchanged)."""
    if codec == CompressionType.NONE:
        return data
    return _COMPRESS[codec](data)


def decompress(codec: int, data: bytes) -> bytes:
    """Decompress a batch body; raise InvalidRecordError when it is not valid."""
    if codec == CompressionType.NONE:
        return data
    try:
        fn = _DECOMPRESS[CompressionType(codec)]
    except (ValueError, KeyError):
        raise InvalidRecordError(f"unknown compression codec {codec} in batch attributes") from None
    try:
        return fn(data)
    except Exception as exc:  # each library raises its own types
        raise InvalidRecordError(
            f"cannot decompress a {CompressionType(codec).name.lower()} batch body: {exc}"
        ) from exc
