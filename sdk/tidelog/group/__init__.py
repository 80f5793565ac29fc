"""Consumer groups, client side: membership (the heartbeat protocol), offsets, assignors.

Used by the Consumer (`Consumer(group_id=..., subscribe([...]))`) and by admin
tools; the assignors are shared with the coordinator, which runs them.
"""

from tidelog.group.assignors import ASSIGNORS, DEFAULT_ASSIGNOR, assign
from tidelog.group.membership import GroupMembership, RebalanceListener
from tidelog.group.offsets import OffsetAndMetadata, OffsetStoreClient

__all__ = [
    "ASSIGNORS",
    "DEFAULT_ASSIGNOR",
    "GroupMembership",
    "OffsetAndMetadata",
    "OffsetStoreClient",
    "RebalanceListener",
    "assign",
]
