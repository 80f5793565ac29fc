"""Consumer groups, client side: membership (the heartbeat protocol), offsets.

Used by the Consumer (`Consumer(group_id=..., subscribe([...]))`) and by admin
tools. The assignors run in the coordinator (`tidelog_coordinator.assignors`):
a member only names the one it wants.
"""

from tidelog.group.membership import DEFAULT_ASSIGNOR, GroupMembership, RebalanceListener
from tidelog.group.offsets import OffsetAndMetadata, OffsetStoreClient

__all__ = [
    "DEFAULT_ASSIGNOR",
    "GroupMembership",
    "OffsetAndMetadata",
    "OffsetStoreClient",
    "RebalanceListener",
]
