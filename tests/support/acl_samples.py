"""Random ACL bindings for the tests that check an index against a scan
(tests/unit/server/test_acl_table_index.py, tests/unit/coordinator/
test_acl_deletions.py): each draws from its own small sets of names,
principals and hosts, so that random bindings and requests meet often."""

from __future__ import annotations

import random
from collections.abc import Sequence

from tidelog_server.acls import CLUSTER_NAME, OPERATIONS, AclBinding


def random_binding(
    rng: random.Random,
    *,
    names: Sequence[str],
    principals: Sequence[str],
    hosts: Sequence[str],
    permissions: Sequence[str] = ("allow", "deny"),
) -> AclBinding:
    """A binding on a topic (half the time), a group or the cluster; a name
    from `names`, literal or prefixed (the wildcard "*" literal only)."""
    resource_type = rng.choice(["topic", "topic", "group", "cluster"])
    if resource_type == "cluster":
        name, pattern = CLUSTER_NAME, "literal"
    else:
        name = rng.choice(names)
        pattern = "literal" if name == "*" else rng.choice(["literal", "prefixed"])
    return AclBinding.checked(
        resource_type,
        name,
        pattern,
        rng.choice(principals),
        rng.choice(hosts),
        rng.choice(OPERATIONS),
        rng.choice(permissions),
    )
