"""Waiting for an asynchronous collective of the real layer: within the layer's timeout, and
failing with the rank, the operation and its peers named, never hanging."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from exec.errors import ExecError


def wait_work(work: Any, rank: int, what: str, peers: list[int], timeout_s: float) -> None:
    """Wait for an async collective within the timeout; fail naming the rank, the operation
    and its peers, never hang."""
    err: RuntimeError | None
    try:
        ok = work.wait(timeout=timedelta(seconds=timeout_s))
    except RuntimeError as e:
        ok, err = False, e
    else:
        err = None
    if not ok:
        why = f"failed: {str(err).strip().splitlines()[0]}" if err else ""
        if err is None or "timed out" in str(err).lower():
            why = f"did not complete within {timeout_s:g} s"
        raise ExecError(f"rank {rank}: {what} (peers {peers}) {why}")
