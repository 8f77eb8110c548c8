"""What a long engine run shows while it runs: a bar of finished tasks with the simulated
time beside it, and, once, a hint when the flow-rate solve is slow and exact.

The engine calls `tick` every `step` finished tasks (one comparison per task otherwise) and
`solved` after each rate solve of the network, which redraws the bar once REFRESH_S of wall
time has passed since the last redraw (not every so many solves: one solve of a large skewed
all-to-allv can take seconds, and the bar froze for 10-20 s between polls), so a run whose
tasks wait minutes on one skewed all-to-allv still moves its bar and its simulated time.
Both cost nothing measurable next to the work they follow; with progress off
(`sim.core.progress`) the bar is a no-op.
"""

from __future__ import annotations

import math
import os
import time

from sim.core import progress
from sim.core.progress import Bar, hint
from sim.hardware.network.flows import FINISH_RTOL

# Wall seconds the rate solve may take, summed over a run, before the hint; the variable
# lets tests ask for it at once without a slow run.
SLOW_SOLVE_S = 10.0
SLOW_SOLVE_ENV = "MOESIM_SLOW_SOLVE_HINT_S"

HINT = (
    "the flow-rate solve has taken {s:.0f} s of wall time with exact flow finishes; "
    "`costs.finish_rtol: 1.0e-3` in the config (or `--cost finish_rtol=1e-3`) ends flows "
    "that finish within 0.1% of each other together, usually several times faster at under "
    "0.1% makespan error (see benchmarks/skewed_scale.py)"
)


class Watch:
    __slots__ = ("bar", "step", "next", "solve_s", "hint_at", "drawn", "total")

    def __init__(self, total: int, finish_rtol: float):
        self.total = total
        self.bar = Bar(total, "simulate", "task")
        self.step = max(1, total // 500)
        self.next = self.step  # the finished-task count of the next tick
        self.solve_s = 0.0
        self.drawn = clock()  # wall time of the last redraw from `solved`
        exact = finish_rtol <= FINISH_RTOL  # unset (the exact default) or 0
        self.hint_at = _threshold() if exact else math.inf

    def tick(self, done: int, now: float) -> None:
        self.next = done + self.step
        self.bar.set(done)
        self.bar.note(f"{now * 1e3:.3f} ms simulated")

    def solved(self, seconds: float, done: int, now: float) -> None:
        """One rate solve of `seconds` wall time has ended."""
        self.solve_s += seconds
        if self.solve_s > self.hint_at:
            self.hint_at = math.inf
            hint("finish_rtol", HINT.format(s=self.solve_s))
        t = clock()
        if t - self.drawn >= progress.REFRESH_S:
            self.drawn = t
            self.bar.note(f"{now * 1e3:.3f} ms simulated")
            self.bar.set(done)
            self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def _threshold() -> float:
    text = os.environ.get(SLOW_SOLVE_ENV)
    if text is None:
        return SLOW_SOLVE_S
    try:
        return float(text)
    except ValueError:
        return SLOW_SOLVE_S


def clock() -> float:
    return time.perf_counter()
