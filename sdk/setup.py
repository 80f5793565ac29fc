"""The SDK's one C extension, tidelog._crecords: the consumer's per-record
loop and the columnar read's column pass (see its source). Optional: where
no C compiler is at hand the build says so and goes on, and tidelog.records
and tidelog.columnar use their pure-Python twins. All other metadata is in
pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tidelog._crecords",
            ["tidelog/_crecords.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
