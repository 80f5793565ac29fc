"""The broker's exception-to-wire-error mapping: the shared ErrorMapper
(tidelog_server.service_errors, which documents the two shapes) with the broker's
logger. Servicers import `error_proto` and `abort` from here."""

from __future__ import annotations

import logging

from tidelog_server.service_errors import ErrorMapper

_MAPPER = ErrorMapper(logging.getLogger("tidelog.broker"))

error_proto = _MAPPER.error_proto
abort = _MAPPER.abort
