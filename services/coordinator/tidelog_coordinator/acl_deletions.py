"""Which stored ACL bindings the filters of one DeleteAcls delete, and a
bound on the matching work that costs the coordinator's event loop.

Each binding is claimed once, by the first filter that matches it
(AclFilter.matches decides, always); a filter given again is not matched
again (it would find what it matches claimed already). A filter is matched
against candidates only, taken from indexes built once per request from the
bindings it read:

- a filter naming a resource (`resource_name` neither empty nor "any") with
  pattern type literal, prefixed or any: the bindings of that name (the
  filter compares names case-insensitively, so the index is by the name in
  lower case), or those of the principal it names when they are fewer;
- pattern type "match": the bindings whose pattern applies to the name (a
  literal of the name, the literal "*", a prefix of the name) in each
  resource type the filter accepts (acls.PatternIndex);
- otherwise, naming a principal: that principal's bindings;
- otherwise every binding.

So a DeleteAcls of 1,000 filters naming topics costs about the bindings of
those topics, not 1,000 x the bindings stored. Filters that name neither a
resource nor a principal (or name one shared by many bindings) can still
cost every binding each: the candidates a request's filters are matched
against are at most MATCH_SCANS_PER_REQUEST times the bindings stored, and
a filter whose candidates do not fit in what is left is refused (its error
names the limit) and matched against nothing; how many candidates a filter
has is known from the indexes' bucket sizes, so a refusal costs no match.
A single filter always fits.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from tidelog.errors import InvalidRequestError
from tidelog_server.acls import AclBinding, AclFilter, PatternIndex, names_a_value

#: What one DeleteAcls's filters may be matched against, in multiples of the
#: bindings stored: ten filters that each match against every binding (at the
#: default --max-acl-bindings of 10,000, ~100,000 matches, tens of ms).
MATCH_SCANS_PER_REQUEST = 10

#: (etcd key, binding) as read from etcd.
Stored = tuple[bytes, AclBinding]


@dataclass(slots=True)
class Claims:
    """What the filters of one request delete."""

    #: Key of each binding deleted -> index of the filter that claimed it.
    claimed: dict[bytes, int] = field(default_factory=dict)
    #: Index of each filter refused -> why.
    refused: dict[int, InvalidRequestError] = field(default_factory=dict)


class _Candidates:
    """The indexes of one request's bindings, each built on first use."""

    def __init__(self, bindings: Sequence[Stored]) -> None:
        self._bindings = bindings
        self._by_name: dict[str, list[Stored]] | None = None
        self._by_principal: dict[str, list[Stored]] | None = None
        self._by_type: dict[str, PatternIndex] | None = None

    def of(self, wanted: AclFilter) -> tuple[int, Iterable[Stored]]:
        """Bindings that include every one `wanted` matches, and how many
        (known without reading them)."""
        if wanted.pattern_type.lower() == "match":
            indexes = self._types(wanted.resource_type)
            name = wanted.resource_name
            count = sum(index.count_matching(name) for index in indexes)
            return count, _applying(indexes, name)
        choices: list[list[Stored]] = []
        if names_a_value(wanted.resource_name):
            choices.append(self._names().get(wanted.resource_name.lower(), []))
        if names_a_value(wanted.principal):
            choices.append(self._principals().get(wanted.principal.lower(), []))
        chosen = min(choices, key=len) if choices else self._bindings
        return len(chosen), chosen

    def _names(self) -> dict[str, list[Stored]]:
        if self._by_name is None:
            self._by_name = {}
            for stored in self._bindings:
                self._by_name.setdefault(stored[1].resource_name.lower(), []).append(stored)
        return self._by_name

    def _principals(self) -> dict[str, list[Stored]]:
        if self._by_principal is None:
            self._by_principal = {}
            for stored in self._bindings:
                self._by_principal.setdefault(stored[1].principal.lower(), []).append(stored)
        return self._by_principal

    def _types(self, resource_type: str) -> list[PatternIndex]:
        """The pattern indexes of the resource types `resource_type` accepts."""
        if self._by_type is None:
            self._by_type = {}
            for arrival, (key, binding) in enumerate(self._bindings):
                index = self._by_type.get(binding.resource_type)
                if index is None:
                    index = self._by_type[binding.resource_type] = PatternIndex()
                index.add(key, arrival, binding)
        # AclFilter compares the resource type case-insensitively.
        return [
            index
            for stored_type, index in self._by_type.items()
            if not names_a_value(resource_type) or resource_type.lower() == stored_type.lower()
        ]


def _applying(indexes: list[PatternIndex], name: str) -> Iterator[Stored]:
    for index in indexes:
        for key, _arrival, binding in index.matching(name):
            yield key, binding


def claim(bindings: Sequence[Stored], filters: Sequence[AclFilter]) -> Claims:
    """Which of `bindings` each of `filters` (in request order) deletes."""
    claims = Claims()
    budget = MATCH_SCANS_PER_REQUEST * max(1, len(bindings))
    left = budget
    candidates = _Candidates(bindings)
    # A filter given again gets what it got the first time: nothing left to
    # delete, or the same refusal.
    seen: dict[AclFilter, InvalidRequestError | None] = {}
    for index, wanted in enumerate(filters):
        if wanted in seen:
            refusal = seen[wanted]
            if refusal is not None:
                claims.refused[index] = refusal
            continue
        count, chosen = candidates.of(wanted)
        if count > left:
            refusal = seen[wanted] = InvalidRequestError(
                f"this filter matches against {count} bindings, more than are left of the "
                f"{budget} one DeleteAcls may match against ({MATCH_SCANS_PER_REQUEST} times "
                f"the {len(bindings)} stored, MATCH_SCANS_PER_REQUEST): send it in another "
                "request, or name a resource or principal in it"
            )
            claims.refused[index] = refusal
            continue
        seen[wanted] = None
        left -= count
        for key, binding in chosen:
            if key not in claims.claimed and wanted.matches(binding):
                claims.claimed[key] = index
    return claims
