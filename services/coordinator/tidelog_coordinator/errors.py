"""The coordinator's exception-to-wire-error mapping: the shared ErrorMapper
(tidelog_server.service_errors, which documents the two shapes) with one addition:
etcd being unreachable is COORDINATOR_NOT_AVAILABLE (retriable), not a bug."""

from __future__ import annotations

import logging

from tidelog.errors import CoordinatorNotAvailableError, TidelogError
from tidelog_server.etcd import is_unavailable
from tidelog_server.service_errors import ErrorMapper


def _etcd_outage(exc: BaseException, what: str) -> TidelogError | None:
    if is_unavailable(exc):
        return CoordinatorNotAvailableError(f"etcd is not reachable while {what}: retry")
    return None


_MAPPER = ErrorMapper(logging.getLogger("tidelog.coordinator"), translate=_etcd_outage)

error_proto = _MAPPER.error_proto
abort = _MAPPER.abort
