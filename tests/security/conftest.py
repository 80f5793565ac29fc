"""The seed of a fuzz run, chosen once per test (tests/security/fuzz_sending.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.security.fuzz_sending import chosen_seed


@pytest.fixture
def fuzz_seed() -> Iterator[int]:
    seed = chosen_seed()
    # Printed whatever happens (pytest shows it with the failure, and with -s).
    print(f"\nfuzz seed {seed} (replay: TIDELOG_FUZZ_SEED={seed})", file=sys.stderr)
    yield seed
