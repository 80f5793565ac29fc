"""The SDK's C extensions: tidelog._crecords, the consumer's per-record loop
and the columnar read's column pass, and tidelog._cproduce, the blocking
Producer's send() fast lane (see their sources). Optional: where no C
compiler is at hand the build says so and goes on, and tidelog.records,
tidelog.columnar and tidelog._accumulator use their pure-Python paths. All
other metadata is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tidelog._crecords",
            ["tidelog/_crecords.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
        Extension(
            "tidelog._cproduce",
            ["tidelog/_cproduce.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
    ]
)
