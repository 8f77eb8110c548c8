"""The CUDA executor's host thread honours `Task.host_sync` (split sizes read on the host):
it issues nothing after such a task until the task has finished. Checked without a GPU on a
stand-in for torch.cuda whose kernels finish only when the host polls their end event."""

from __future__ import annotations

import contextlib

import torch

from exec.runtime import runner
from exec.runtime.ops import Op
from sim.core.graph import Task, TaskGraph


class _Log:
    def __init__(self) -> None:
        self.events: list[str] = []  # "launch X", "done X" in the order the host saw them


class _Event:
    """Finishes on the second query after it was recorded (a kernel still running at first)."""

    def __init__(self, log: _Log, name: str) -> None:
        self.log, self.name, self.polls, self.recorded = log, name, 0, False

    def record(self, stream=None) -> None:
        self.recorded = True

    def query(self) -> bool:
        self.polls += 1
        if self.polls >= 2 and self.name and f"done {self.name}" not in self.log.events:
            self.log.events.append(f"done {self.name}")
        return self.polls >= 2

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other) -> float:
        return 0.0


def _fake_cuda(monkeypatch) -> None:
    class Stream:
        def __init__(self, device=None) -> None:
            pass

        def wait_event(self, ev) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())


def _run(monkeypatch, sync: bool) -> list[str]:
    log = _Log()
    g = TaskGraph(1)
    g.add(Task("counts", 0, "comm", "elementwise", bytes=8.0, host_sync=sync))
    g.add(Task("a", 0, "compute", "elementwise", bytes=8.0))
    g.add(Task("b", 0, "compute", "elementwise", bytes=8.0, deps=["counts"]))
    ops = [Op(t, (lambda t=t: log.events.append(f"launch {t.id}")), False, t.id) for t in g]
    _fake_cuda(monkeypatch)
    ex = runner._CudaExecutor(g, 0, ops, torch.device("cpu"), timeout_s=5.0)
    # the events' names, in the order the executor creates them: ref, then (start, end) per op
    seq = iter(["", *[x for op in ex.ops for x in ("", op.task.id)]])
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing=False: _Event(log, next(seq)))
    ex.run()
    return log.events


def test_a_host_sync_holds_back_every_later_launch(monkeypatch):
    events = _run(monkeypatch, sync=True)
    assert events.index("done counts") < events.index("launch a")
    assert events.index("done counts") < events.index("launch b")


def test_without_a_host_sync_the_host_issues_ahead(monkeypatch):
    events = _run(monkeypatch, sync=False)
    assert events[:3] == ["launch counts", "launch a", "launch b"]
