"""The gateway's exception-to-wire-error mapping: the shared ErrorMapper
(tidelog_server.service_errors documents the two shapes, in-band per item and
whole-call) with the gateway's logger."""

from __future__ import annotations

import logging

from tidelog_server.service_errors import ErrorMapper

_MAPPER = ErrorMapper(logging.getLogger("tidelog.gateway"))

error_proto = _MAPPER.error_proto
abort = _MAPPER.abort
