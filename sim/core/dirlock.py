"""An exclusive lock on an output folder: journals that a re-run appends to (a sweep's, a
plan's) are never written by two runs at once."""

from __future__ import annotations

import os
from pathlib import Path

from sim.core.errors import ConfigError


def lock_dir(d: Path, lock_name: str, busy: str) -> int | None:
    """An exclusive lock on `d` (a file `lock_name` in it) for as long as the returned fd is
    open, so that two runs never append to one folder's journal at once; `busy` is the
    one-line error when another holds it. None where the OS has no flock (Windows): such
    runs into one folder are unguarded."""
    try:
        import fcntl
    except ImportError:
        return None
    fd = os.open(d / lock_name, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ConfigError(busy) from None
    return fd
