"""Tidelog's benchmarks: ``python -m bench`` and the ``bench.*`` tools.

Every tool measures the SDK as an application gets it by default. Importing tidelog chooses
gRPC's client transport (tidelog._grpc_setup), which only works before gRPC itself is imported;
a tool whose first import of gRPC came before tidelog's (isort puts ``import grpc`` first) ran
its clients on gRPC's default transport instead, with ~0.5 more thread wake-ups per record at
one record per request. Importing tidelog here, first of all, settles it for every tool: Python
imports this package before any of its modules.
"""

import tidelog  # noqa: F401  (see the module doc)
