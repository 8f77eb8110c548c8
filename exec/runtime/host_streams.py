"""A rank's streams on the CPU: one long-lived host thread per stream, reused by every run.

Each thread runs its stream's tasks in program order; a task starts when its thread reaches it
and every dependency has finished (one threading.Event per task and run). Communication is
issued as an async torch.distributed op and waited on with the timeout, so the stream is busy
until the operation completes, as a CUDA stream is while a NCCL kernel runs.

Why the threads outlive a run: OpenMP keeps a team of worker threads per host thread, built at
that thread's first parallel op, and the BLAS library keeps per-thread state alike. Threads
made afresh for each run built both inside the timed run: with 2 torch threads per rank on a
lent VM's host the first task of each timed run took 5-9 ms instead of 0.03-0.2 ms
(reports/gpu-h100-80gb-hbm3-2026-11-28/README.md, issue 29). Made once, the warm-up run
builds them.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

import torch

from exec.errors import ExecError
from exec.runtime.ops import Op

POLL_S = 0.05  # how often blocked threads look for an abort from another stream


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def comm_failure(rank: int, op: Op, timeout_s: float, e: BaseException | None) -> ExecError:
    if e is None or "timed out" in str(e).lower() or "timeout" in str(e).lower():
        return ExecError(
            f"rank {rank}: {op.what} did not complete within {timeout_s:g} s: a peer never "
            "launched it, launched it out of order, or is stuck"
        )
    return ExecError(
        f"rank {rank}: {op.what} failed: {one_line(e)} (a peer may have died or timed out)"
    )


class _Aborted(Exception):
    """Another stream failed; this one stops without adding an error of its own."""


@dataclass
class _Run:
    """One run's shared state: what has finished, when each task ran, the first error."""

    done: dict[str, threading.Event]
    streams_left: int
    stamps: dict[str, tuple[int, int]] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)
    abort: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def stream_ended(self) -> None:
        with self.lock:
            self.streams_left -= 1
            if self.streams_left == 0:
                self.finished.set()


class HostStreams:
    """The CPU executor of one rank: `run()` runs every stream's tasks once and returns each
    task's (start, end) host perf_counter_ns."""

    def __init__(self, rank: int, ops: list[Op], timeout_s: float):
        self.rank, self.timeout_s = rank, timeout_s
        self.streams: dict[str, list[Op]] = defaultdict(list)
        for op in ops:
            self.streams[op.task.stream].append(op)
        self._jobs: dict[str, queue.SimpleQueue[_Run]] = {}

    def _start(self) -> None:
        threads = torch.get_num_threads()
        for s, ops in self.streams.items():
            jobs: queue.SimpleQueue[_Run] = queue.SimpleQueue()
            # daemon: a thread still blocked in a collective after an error ends with its own
            # timeout, or with the process
            th = threading.Thread(
                target=self._serve, args=(jobs, ops, threads), name=f"rank{self.rank}:{s}"
            )
            th.daemon = True
            th.start()
            self._jobs[s] = jobs

    def _serve(self, jobs: queue.SimpleQueue[_Run], ops: list[Op], threads: int) -> None:
        # OpenMP's thread count is per thread: a new thread would start a team of one
        # thread per core, whose idle members spin and steal the other ranks' cores.
        torch.set_num_threads(threads)
        while True:
            run = jobs.get()
            try:
                self._stream(run, ops)
            finally:
                run.stream_ended()

    def _stream(self, run: _Run, ops: list[Op]) -> None:
        timeout = timedelta(seconds=self.timeout_s)
        try:
            for op in ops:
                for d in op.task.deps:
                    while not run.done[d].wait(POLL_S):
                        if run.abort.is_set():
                            raise _Aborted
                if run.abort.is_set():
                    raise _Aborted
                start = time.perf_counter_ns()
                work = op.launch()
                if op.is_comm:
                    try:
                        ok = work.wait(timeout=timeout)
                    except RuntimeError as e:
                        raise comm_failure(self.rank, op, self.timeout_s, e) from None
                    if ok is False:
                        raise comm_failure(self.rank, op, self.timeout_s, None)
                end = time.perf_counter_ns()
                run.stamps[op.task.id] = (start, end)
                run.done[op.task.id].set()
        except _Aborted:
            pass
        except BaseException as e:  # noqa: BLE001 - reported by the caller's thread
            run.errors.append(e)
            run.abort.set()

    def run(self) -> dict[str, tuple[int, int]]:
        if not self._jobs:
            self._start()
        if not self._jobs:  # a rank with no tasks
            return {}
        done = {op.task.id: threading.Event() for ops in self.streams.values() for op in ops}
        run = _Run(done, streams_left=len(self._jobs))
        for jobs in self._jobs.values():
            jobs.put(run)
        # on an error return at once: a stream blocked in a collective is not waited for
        while not run.finished.wait(POLL_S) and not run.abort.is_set():
            pass
        if run.errors:
            raise run.errors[0]
        return run.stamps
