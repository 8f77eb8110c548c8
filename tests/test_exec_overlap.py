"""The real layer's comm-stream threads (`exec.layers.overlap`): hand-offs between streams, and a
failure on any thread re-raised on the caller's, never a hang."""

from __future__ import annotations

import threading

import pytest
import torch

from exec.layers.overlap import Overlap


def test_streams_hand_off_in_order_and_keep_grad_mode():
    ov = Overlap("t")
    ready = [threading.Event() for _ in range(3)]
    seen: dict[str, object] = {}
    got: list[int] = []

    def comm(stream: str) -> None:
        seen[stream] = (torch.is_grad_enabled(), threading.current_thread().name)
        for j in range(3):
            ready[j].set()

    def compute() -> None:
        for j in range(3):
            ov.wait(ready[j])
            got.append(j)

    with torch.no_grad():
        ov.run(["a", "b"], comm, compute)
    assert got == [0, 1, 2]
    assert seen == {"a": (False, "t:a"), "b": (False, "t:b")}


def test_a_comm_failure_reaches_the_caller_and_frees_the_waiters():
    ov = Overlap("t")
    never = threading.Event()

    def comm(stream: str) -> None:
        if stream == "bad":
            raise RuntimeError("peer gone")
        ov.wait(never)  # the other comm stream: released by the abort

    def compute() -> None:
        ov.wait(never)

    with pytest.raises(RuntimeError, match="peer gone"):
        ov.run(["ok", "bad"], comm, compute)


def test_a_compute_failure_stops_the_comm_streams():
    ov = Overlap("t")
    never, started = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []

    def comm(stream: str) -> None:
        threads.append(threading.current_thread())
        started.set()
        ov.wait(never)

    def compute() -> None:
        raise ValueError("bad expert")

    with pytest.raises(ValueError, match="bad expert"):
        ov.run(["c"], comm, compute)
    assert started.wait(5)
    threads[0].join(5)
    assert not threads[0].is_alive()
