"""Host seconds to issue one task, per task kind: what the launch thread (`sim.engine.launch`)
spends on each task it issues.

`costs.resources.launch_s` is one figure for every task (a CUDA kernel launch, a few
microseconds). An executor's tasks cost its host very different amounts: one copy kernel
with its two timing events, or a torch.distributed collective, whose Python and NCCL
bookkeeping took 60-170 us per call on an H200's host against 35-95 us for a copy
(reports/gpu-h200-2026-11-27: the validation's measured starts, which follow the host while
the GPU waits for it). `costs.launch` gives the figure per kind (`moesim calibrate` measures
it on a GPU: the executor's host time per issued task, `exec.runtime.runner`); a kind it does
not name costs `resources.launch_s`. All zero: the thread is free and the engine is exactly
as without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.core.errors import ConfigError
from sim.core.graph import Task
from sim.core.kinds import ALL_KINDS

if TYPE_CHECKING:
    import pandas as pd

# kinds a calibration does not issue, and the measured kind whose host cost they take: the
# same torch.distributed or copy call with other arguments (HostLaunch.of)
STAND_INS = {
    "all_to_allv": "all_to_all",
    "broadcast": "all_reduce",
    "send": "all_to_all",
    "recv": "all_to_all",
    "d2d": "d2h",
}


@dataclass(frozen=True)
class HostLaunch:
    """Host seconds per issued task: by kind, else `default` (`resources.launch_s`)."""

    default: float = 0.0
    by_kind: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, raw: Any, default: float, where: str = "costs.launch") -> HostLaunch:
        if raw is None:
            return cls(default)
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a mapping of task kind to host seconds")
        out = {}
        for k, v in raw.items():
            if k not in ALL_KINDS:
                raise ConfigError(f"{where}.{k}: unknown task kind (known: {sorted(ALL_KINDS)})")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
                raise ConfigError(f"{where}.{k}: expected host seconds in [0, 1), got {v!r}")
            out[str(k)] = float(v)
        return cls(default, out)

    def of(self, task: Task) -> float:
        """The task's kind's figure, else its stand-in's (STAND_INS), else `default`."""
        k = task.kind if task.kind in self.by_kind else STAND_INS.get(task.kind, task.kind)
        return self.by_kind.get(k, self.default)

    @property
    def free(self) -> bool:
        return self.default <= 0 and not any(v > 0 for v in self.by_kind.values())


def fit_launch(issues: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per task kind (rows: op, issue seconds): the mean, median and count of its quiet issue
    times (`robust.quiet_gaps`: a busy host's slow ones left out). The mean is what a run
    uses, as for the dispatch gaps: a makespan adds up every launch.

    Measured on an H200 (reports/gpu-h200-2026-11-27, run 2), the means are above what the
    layers' own tasks cost the host (all_to_all 106 us against 56-121; a memory-bound task 92
    against 38-60). A full launch queue is not the cause: counting only the issues the GPU
    caught up with (run 3) left the GEMMs' 62 us as it was. Lower estimators were worse
    against the measurements of both runs that validated them
    (benchmarks/results/twin_resim_big.md, re-simulated offline): the medians, validation
    MAPE 6.8% -> 7.5% on run 2; only the caught-up issues (run 3's calibration), 7.8% on run
    2's measurements and 10.1% on run 3's, against 6.8% and 8.8% for these means. Those fit
    the pipelined layer's backward better and its forward worse: what the means make up for
    is something else the forward passes lose (reports/gpu-h200-2026-11-27/README.md)."""
    from sim.hardware.costs.robust import quiet_gaps

    out = {}
    for op, g in issues.groupby("op"):
        q = quiet_gaps(g["issue"].to_numpy(dtype=float))
        if len(q):
            out[str(op)] = {"mean": float(q.mean()), "median": float(np.median(q)), "n": len(q)}
    return out
