"""A group member in its own process, for tests that SIGKILL it.

Usage: python -m tests.integration.coordinator.member_proc ADDRESS GROUP TOPIC SESSION_MS [INSTANCE]
Prints one JSON line per assignment change: {"member_id", "epoch", "partitions"}.
"""

from __future__ import annotations

import asyncio
import json
import sys

from tidelog.group import GroupMembership


async def main(address: str, group: str, topic: str, session_ms: int, instance: str) -> None:
    member = GroupMembership(
        address, group, topics=[topic], session_timeout_ms=session_ms, group_instance_id=instance
    )
    await member.start()
    last: list[object] = [None]
    while True:
        await member.wait_for(lambda m: (m.member_epoch, m.assignment) != last[0], timeout_s=3600)
        last[0] = (member.member_epoch, member.assignment)
        print(
            json.dumps(
                {
                    "member_id": member.member_id,
                    "epoch": member.member_epoch,
                    "partitions": sorted(p for _, p in member.assignment),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[0], args[1], args[2], int(args[3]), args[4] if len(args) > 4 else ""))
