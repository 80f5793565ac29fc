"""The coordinator's limits on stored ACL bindings, quota entities and users
on its command line (tidelog_coordinator.__main__): their defaults are the
config's, and a limit that would refuse every binding, entity or user is
refused at start, naming the flag."""

from __future__ import annotations

import pytest
from tidelog_coordinator.__main__ import parse_args
from tidelog_coordinator.config import CoordinatorConfig


def test_the_limits_default_to_the_configs_and_are_read_from_the_flags() -> None:
    config, _ = parse_args([])
    assert config.max_acl_bindings == CoordinatorConfig().max_acl_bindings
    assert config.max_quota_entities == CoordinatorConfig().max_quota_entities
    assert config.max_users == CoordinatorConfig().max_users
    config, _ = parse_args(
        ["--max-acl-bindings", "7", "--max-quota-entities", "9", "--max-users", "11"]
    )
    assert (config.max_acl_bindings, config.max_quota_entities, config.max_users) == (7, 9, 11)


@pytest.mark.parametrize("flag", ["--max-acl-bindings", "--max-quota-entities", "--max-users"])
def test_a_limit_below_one_is_refused_naming_the_flag(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args([flag, "0"])
    assert f"{flag} must be at least 1, got 0" in capsys.readouterr().err
