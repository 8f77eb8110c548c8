"""Session set-up shared by every test module."""

from __future__ import annotations

import compileall
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_sessionstart(session) -> None:  # noqa: ARG001 (pytest's hook signature)
    # The executor's tests start fresh rank interpreters; where the environment sets
    # PYTHONDONTWRITEBYTECODE nothing is cached and every rank compiles sim/ and exec/ from
    # source again (~10 CPU-s over the suite). Compile them once, up front.
    for pkg in ("sim", "exec"):
        compileall.compile_dir(ROOT / pkg, quiet=1)


@pytest.fixture(autouse=True)
def _own_input_cache(tmp_path_factory, monkeypatch):
    """Each test's validated-input cache (sim.core.inputcache) in a directory of its own,
    empty at its start: no test reads what another (or the user's ~/.cache) remembered, and
    the processes it starts inherit the directory."""
    monkeypatch.setenv("MOESIM_CACHE_DIR", str(tmp_path_factory.mktemp("moesim-cache")))
    monkeypatch.delenv("MOESIM_NO_CACHE", raising=False)
