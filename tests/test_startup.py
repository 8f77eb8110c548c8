"""Start-up stays cheap: `import sim` and building the `moesim` parser (the executor's
subcommands included) import none of the heavy libraries; the commands that need them import
them when they run. What that costs in CPU time is recorded by benchmarks/startup.py (tests
do not time anything)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("pandas", "plotly", "networkx", "torch", "simpy", "yaml", "numpy")


def _imported_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


@pytest.mark.parametrize(
    "code",
    [
        "import sim",
        "import sim.cli; sim.cli.build_parser()",
        "import sim.api, exec.api, exec.cli",
    ],
)
def test_startup_imports_no_heavy_library(code):
    assert _imported_after(code) == []


def test_help_imports_no_heavy_library():
    code = (
        "import contextlib, io, sim.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    sim.cli.main(['--help'])"
    )
    assert _imported_after(code) == []
