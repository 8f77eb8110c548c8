"""Session set-up shared by every test module."""

from __future__ import annotations

import compileall
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pytest_sessionstart(session) -> None:  # noqa: ARG001 (pytest's hook signature)
    # The executor's tests start fresh rank interpreters; where the environment sets
    # PYTHONDONTWRITEBYTECODE nothing is cached and every rank compiles sim/ and exec/ from
    # source again (~10 CPU-s over the suite). Compile them once, up front.
    for pkg in ("sim", "exec"):
        compileall.compile_dir(ROOT / pkg, quiet=1)
