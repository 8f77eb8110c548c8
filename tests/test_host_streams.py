"""The CPU executor's stream threads (`exec.runtime.host_streams`): made once and reused by
every run (so the warm-up builds their OpenMP teams, not the timed run), dependencies across
streams kept, and a failure on one stream re-raised on the caller's thread, never a hang."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from exec.runtime.host_streams import HostStreams


@dataclass
class _Task:
    id: str
    stream: str
    deps: list[str] = field(default_factory=list)


class _Op:
    """Duck-typed exec.runtime.ops.Op: records the thread it ran on and the torch threads."""

    is_comm = False

    def __init__(self, task: _Task, log: dict[str, list[Any]], fail: bool = False):
        self.task, self.log, self.fail = task, log, fail
        self.what = f"task {task.id!r}"

    def launch(self) -> None:
        if self.fail:
            raise RuntimeError(f"{self.task.id} broke")
        time.sleep(0.002)
        self.log.setdefault(self.task.id, []).append(
            (threading.get_ident(), torch.get_num_threads())
        )


def test_runs_reuse_their_stream_threads_and_keep_dependencies():
    log: dict[str, list[Any]] = {}
    ops = [
        _Op(_Task("a", "compute"), log),
        _Op(_Task("x", "comm", deps=["a"]), log),
        _Op(_Task("b", "compute", deps=["x"]), log),
    ]
    hs = HostStreams(0, ops, timeout_s=5.0)  # type: ignore[arg-type]
    first, second = hs.run(), hs.run()
    for stamps in (first, second):
        assert stamps["a"][1] <= stamps["x"][0] and stamps["x"][1] <= stamps["b"][0]
    # one thread per stream, the same in both runs; each keeps the caller's torch threads
    threads = {tid: {ident for ident, _ in runs} for tid, runs in log.items()}
    assert threads["a"] == threads["b"] and len(threads["a"]) == 1
    assert threads["x"] != threads["a"] and len(threads["x"]) == 1
    assert threading.get_ident() not in threads["a"] | threads["x"]
    assert {n for runs in log.values() for _, n in runs} == {torch.get_num_threads()}


def test_a_failing_stream_aborts_the_run_and_frees_the_waiting_one():
    log: dict[str, list[Any]] = {}
    ops = [
        _Op(_Task("a", "compute"), log, fail=True),
        _Op(_Task("x", "comm", deps=["a"]), log),  # would wait for "a" forever
    ]
    hs = HostStreams(3, ops, timeout_s=5.0)  # type: ignore[arg-type]
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="a broke"):
        hs.run()
    assert time.monotonic() - began < 5.0 and "x" not in log


def test_a_rank_without_tasks_runs_at_once():
    assert HostStreams(1, [], timeout_s=1.0).run() == {}
