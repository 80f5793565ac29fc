"""The optional codecs: a client without a codec's library says which extra to install.

Each case runs in a fresh interpreter where the codec's library cannot be
imported (its name set to None in sys.modules, which is how Python marks a
module as absent), as on a machine where `pip install tidelog` ran without
the extra.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from tidelog.compression import CompressionType, compress, decompress


def _run_without(module: str, code: str) -> subprocess.CompletedProcess[str]:
    script = f"import sys\nsys.modules[{module!r}] = None\n" + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("codec", "module", "extra"),
    [("lz4", "lz4", "lz4"), ("zstd", "zstandard", "zstd"), ("snappy", "cramjam", "snappy")],
)
def test_a_missing_codec_names_its_extra(codec: str, module: str, extra: str) -> None:
    # The batch was compressed where the library exists (here), read where it does not.
    body = compress(CompressionType[codec.upper()], b"payload " * 20)
    result = _run_without(
        module,
        f"""
        from tidelog.compression import CompressionType, compress, decompress
        from tidelog.errors import UnsupportedCodecError
        from tidelog import ProducerConfig

        for attempt in (
            lambda: CompressionType.parse({codec!r}),
            lambda: ProducerConfig(compression_type={codec!r}),
            lambda: compress(CompressionType.{codec.upper()}, b"x"),
            lambda: decompress(int(CompressionType.{codec.upper()}), {body!r}),
        ):
            try:
                attempt()
            except UnsupportedCodecError as exc:
                print(exc)
            else:
                print("no error")
        # What needs no optional library still works.
        assert decompress(1, compress(CompressionType.GZIP, b"still")) == b"still"
        """,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4
    for line in lines:
        assert f"pip install 'tidelog[{extra}]'" in line, line
        assert module in line


def test_installed_codecs_round_trip() -> None:
    for codec in CompressionType:
        assert decompress(int(codec), compress(codec, b"abc" * 100)) == b"abc" * 100
