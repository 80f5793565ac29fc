"""`tidelog dev` without the servers installed: one line naming what to install.

A fresh interpreter where the server packages cannot be imported (names set
to None in sys.modules), as after `pip install tidelog` alone. With them
installed, tests/integration/test_cli.py runs the real local cluster.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_dev_names_the_missing_server_distributions() -> None:
    script = textwrap.dedent(
        """
        import sys
        for name in ("tidelog_server", "tidelog_broker"):
            sys.modules[name] = None
        from tidelog.cli import main
        sys.exit(main(["dev", "--brokers", "1"]))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stdout == ""
    message = result.stderr.strip()
    assert "pip install tidelog-server tidelog-broker" in message, message
    assert "tidelog-coordinator" not in message  # installed: not named
    assert "Traceback" not in message


def test_help_lists_dev_without_importing_the_servers() -> None:
    script = textwrap.dedent(
        """
        import sys
        from tidelog.cli import main
        try:
            main(["--help"])
        except SystemExit:
            pass
        assert not any(m.split(".")[0] in {"tidelog_server", "tidelog_broker",
                       "tidelog_coordinator"} for m in sys.modules), "server imported"
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "dev" in result.stdout and "run a local cluster" in result.stdout
