"""Measured durations: the cost layer of trace replay, and compute-speed scaling for what-ifs.

A task of a replayed trace carries its measured time in its tags, split in two:
- `measured_s`: the operation itself (for communication, from the last member's launch to its
  end: the measured duration less the wait for peers, which the engine re-creates);
- `gap_s`: the measured time from the moment it was ready (stream predecessor and
  dependencies done) to its start: launch latency, thread wake-up, Python between ops. It is
  kept apart so that a what-if can speed the operation up and leave the launch gap alone.

A task with `measured_s` takes `gap_s + measured_s` whatever the cost model would say: compute
through `MeasuredCompute` (a wrapper of the compute model), communication and copies through
`CostModel.measured` (asked by the engine before its own costs). Replayed unedited, every task
then ends exactly when it ended in the measurement (see sim.analysis.replay).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.core.errors import ConfigError
from sim.core.graph import Task
from sim.core.kinds import COMPUTE_KINDS

if TYPE_CHECKING:
    from sim.hardware.costs.compute import ComputeModel

MEASURED_TAG = "measured_s"
GAP_TAG = "gap_s"


def measured(task: Task) -> float | None:
    """The task's replay time (gap + measured), or None where it has no measurement."""
    m = task.tags.get(MEASURED_TAG)
    if m is None:
        return None
    gap = task.tags.get(GAP_TAG, 0.0) or 0.0
    try:
        total = float(m) + float(gap)
    except (TypeError, ValueError):
        raise ConfigError(
            f"task {task.id!r}: tags.{MEASURED_TAG} and tags.{GAP_TAG} must be seconds, "
            f"got {m!r} and {gap!r}"
        ) from None
    if not total >= 0:
        raise ConfigError(f"task {task.id!r}: measured time {total!r} s is negative")
    return total


class _Delegate:
    """Forwards what it does not define to the wrapped model (the engine reads e.g. the
    alpha-beta model's `params` for copies)."""

    inner: Any

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy/pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


@dataclass
class MeasuredCompute(_Delegate):
    """Measured durations where a task has one, the wrapped model's elsewhere."""

    inner: ComputeModel

    def duration(self, task: Task) -> float:
        m = measured(task)
        return self.inner.duration(task) if m is None else m


@dataclass
class ScaledCompute(_Delegate):
    """Compute kinds at `speed` times the wrapped model's speed (what-if `compute.speed`):
    durations divided by `speed`. Copies (d2d phases of collectives) are not compute."""

    inner: ComputeModel
    speed: float

    def __post_init__(self) -> None:
        if not self.speed > 0:
            raise ConfigError(f"compute.speed: expected a factor > 0, got {self.speed!r}")

    def duration(self, task: Task) -> float:
        d = self.inner.duration(task)
        return d / self.speed if task.kind in COMPUTE_KINDS else d
