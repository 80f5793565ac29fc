"""The read-compare-write of the keys under one security prefix (ACL
bindings, quota entities, users) for the security admin RPCs, and the cap on how
many keys that prefix holds.

Each entry of a request names one key (once per request) and how its new
value follows from the stored one (a `Change`). The prefix is read once (one
range read, whatever the number of entries); the writes go in transactions
of at most etcd's --max-txn-ops comparisons and operations, and each
transaction compares what its writes were derived from:

- the mod revision of each key it writes (create revision 0: absent), so
  that a concurrent change of the same key (another AlterClientQuotas of the
  same entity) is never overwritten by a value derived from an older one;
- when it creates keys, that no key under the prefix was created after the
  revision the count was taken at (one comparison over the key range), so
  that the count checked against the cap is an upper bound of what is
  stored when the transaction applies: the cap holds exactly, however many
  requests and coordinator replicas create keys at once (keys deleted
  meanwhile only lower the count).

A transaction that loses a race changes nothing: the prefix is read again,
each of its entries decided again from what is stored now (a quota merged
into the new values, a binding found stored already, the cap reached or not)
and the transaction tried again, WRITE_ATTEMPTS times in all; past that its
entries are refused as retriable (COORDINATOR_NOT_AVAILABLE).

The cap is only as good as its writers: every write of these prefixes goes
through here (the coordinator is their only writer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aetcd
from tidelog.errors import CoordinatorNotAvailableError, InvalidRequestError, TidelogError
from tidelog.v1 import common_pb2
from tidelog_server.etcd.keys import prefix_end

from tidelog_coordinator.errors import error_proto
from tidelog_coordinator.partition_admin import write_attempts

#: Transactions tried for one chunk of a request before its entries are
#: refused as retriable: each failure means another request changed (or
#: created) a key under the prefix meanwhile. Security changes are rare admin
#: calls, so losing this many races in a row means a storm of them; the
#: jittered pauses between attempts (partition_admin.write_attempts) add up
#: to at most ~0.6 s.
WRITE_ATTEMPTS = 8

#: The new value of a key from its stored value (None: absent; a new value
#: of None deletes the key). Raises ValueError for a stored value it cannot
#: read, or a TidelogError for an entry that what is stored refuses (e.g.
#: the removal of a user not stored): that entry is refused with it.
Change = Callable[[bytes | None], bytes | None]


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a request: its index in the request, its key, its change."""

    index: int
    key: bytes
    change: Change


@dataclass(frozen=True, slots=True)
class KeyCap:
    """At most `max_keys` keys under one prefix: `what` they are (plural),
    set by the coordinator's option `flag`."""

    max_keys: int
    what: str
    flag: str

    def refusal(self) -> InvalidRequestError:
        return InvalidRequestError(
            f"storing it would make more than {self.max_keys} {self.what}, the most the "
            f"cluster stores ({self.flag}): delete some first, or raise {self.flag}"
        )


@dataclass(slots=True)
class _Stored:
    """What the prefix holds, as this request knows it: key -> (value, mod
    revision). No key under the prefix was created after `revision` but the
    ones in `keys`; keys may have been deleted or changed since."""

    revision: int
    keys: dict[bytes, tuple[bytes, int]]


@dataclass(slots=True)
class _Plan:
    """One transaction of a chunk, decided from what is stored."""

    compare: list[Any]
    success: list[Any]
    #: (entry, its new value or None for a delete), in the order of `success`.
    writes: list[tuple[Entry, bytes | None]]
    creates: bool


class GuardedWriter:
    """Writes the entries of one request under `prefix` (see module doc).
    Not thread-safe; one per request."""

    def __init__(
        self,
        client: aetcd.Client,
        prefix: bytes,
        cap: KeyCap,
        max_txn_ops: int,
        what: str,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._cap = cap
        # One comparison per key written and one over the key range.
        self._chunk = max(1, max_txn_ops - 1)
        self._what = what
        self._errors: dict[int, common_pb2.Error] = {}

    async def write(self, entries: Sequence[Entry]) -> dict[int, common_pb2.Error]:
        """The error of each entry not stored as asked (by its index); the
        others are stored (or were stored already)."""
        if not entries:
            return self._errors
        position = 0
        try:
            stored = await self._read()
            for position in range(0, len(entries), self._chunk):
                stored = await self._write_chunk(entries[position : position + self._chunk], stored)
        except Exception as exc:
            # etcd could not be read: the entries not decided yet are not stored.
            for entry in entries[position:]:
                self._errors[entry.index] = error_proto(exc, f"reading the stored {self._cap.what}")
        return self._errors

    async def _read(self) -> _Stored:
        listing = await self._client.get_prefix(self._prefix)
        keys = {kv.key: (kv.value, kv.mod_revision) for kv in listing}
        return _Stored(listing.header.revision, keys)

    async def _write_chunk(self, chunk: Sequence[Entry], stored: _Stored) -> _Stored:
        """Write `chunk` in one transaction, re-reading and deciding again
        after each lost race; what is stored after it."""
        plan = None
        async for attempt in write_attempts(WRITE_ATTEMPTS):
            if attempt:
                stored = await self._read()
            plan = self._plan(chunk, stored)
            if not plan.success:
                return stored
            if plan.creates:
                tx = self._client.transactions
                range_end = prefix_end(self._prefix)
                plan.compare.append(tx.create(self._prefix, range_end) < stored.revision + 1)
            try:
                ok, responses = await self._client.transaction(
                    compare=plan.compare, success=plan.success, failure=[]
                )
            except Exception as exc:
                # Maybe applied, maybe not: the next chunk's comparisons do
                # not trust `stored` for these keys (see module doc).
                for entry, _ in plan.writes:
                    self._errors[entry.index] = error_proto(exc, self._what)
                return stored
            if ok:
                return _after(stored, plan, _revision(responses))
        assert plan is not None  # write_attempts yields at least once
        lost = CoordinatorNotAvailableError(
            f"the stored {self._cap.what} kept changing while this request wrote them "
            f"({WRITE_ATTEMPTS} attempts, WRITE_ATTEMPTS): retry"
        )
        for entry, _ in plan.writes:
            self._errors[entry.index] = error_proto(lost, self._what)
        return stored

    def _plan(self, chunk: Sequence[Entry], stored: _Stored) -> _Plan:
        tx = self._client.transactions
        plan = _Plan([], [], [], creates=False)
        count = len(stored.keys)
        for entry in chunk:
            # Decided afresh at each attempt: what is stored may have changed.
            self._errors.pop(entry.index, None)
            current = stored.keys.get(entry.key)
            old = None if current is None else current[0]
            try:
                new = entry.change(old)
            except (ValueError, TidelogError) as exc:
                self._errors[entry.index] = error_proto(exc, self._what)
                continue
            if new == old:
                continue  # stored already: nothing to write
            if current is None:
                if count >= self._cap.max_keys:
                    self._errors[entry.index] = error_proto(self._cap.refusal(), self._what)
                    continue
                count += 1
                plan.creates = True
                plan.compare.append(tx.create(entry.key) == 0)
            else:
                if new is None:
                    count -= 1
                plan.compare.append(tx.mod(entry.key) == current[1])
            if new is None:
                plan.success.append(tx.delete(entry.key))
            else:
                plan.success.append(tx.put(entry.key, new))
            plan.writes.append((entry, new))
        return plan


def _revision(responses: list[Any]) -> int:
    """The revision a successful transaction of puts and deletes made."""
    return max(getattr(r, r.WhichOneof("response")).header.revision for r in responses)


def _after(stored: _Stored, plan: _Plan, revision: int) -> _Stored:
    """What is stored after `plan` applied at `revision`."""
    keys = dict(stored.keys)
    for entry, new in plan.writes:
        if new is None:
            keys.pop(entry.key, None)
        else:
            keys[entry.key] = (new, revision)
    # The range comparison held when it applied: no key was created after
    # stored.revision but ours. Without it, others may have created keys
    # since, so the count is only known as of stored.revision still.
    return _Stored(revision if plan.creates else stored.revision, keys)
