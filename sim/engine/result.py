"""What a simulation returns: per-task times, link bytes, memory, and how the run was made."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.core.graph import TaskGraph
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology


@dataclass
class SimResult:
    """A simulated graph: per-task times, link use, memory and statistics."""

    graph: TaskGraph
    topology: Topology
    costs: CostModel
    start: np.ndarray  # per task, in graph order: launch time on its stream
    end: np.ndarray
    sync_wait: np.ndarray  # time a collective member waited for the others
    link_bytes: np.ndarray  # bytes carried per link instance
    mem_peak: np.ndarray  # per rank, bytes
    mem_timeline: list[tuple[float, int, float]]  # (time, rank, bytes in use)
    stats: dict[str, Any] = field(default_factory=dict)
    # utilisation per link class over time, when asked for (ClassTimeline.as_dict)
    link_timeline: dict[str, Any] | None = None

    @property
    def makespan(self) -> float:
        return float(self.end.max() - self.start.min()) if len(self.end) else 0.0
