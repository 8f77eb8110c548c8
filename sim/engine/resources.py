"""Per-GPU bookkeeping of reserved SMs and HBM shares while the engine runs.

The cost side (what a reservation costs, fitted to an H100) is `sim.hardware.costs.resources`;
this holds, per rank, the SMs and the bandwidth share that running reserving kernels hold, and
answers the speed of a kernel that reserves nothing beside them. Which kernels are slowed:
compute kinds and device copies that reserve no SMs. Not slowed: kernels that reserve SMs
(they run on their own), communication (its kernels hold their own SMs; the interference
table covers a measured slowdown) and host copies (copy engines).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sim.core.errors import ConfigError
from sim.core.graph import Task
from sim.core.kinds import COMM_KINDS
from sim.hardware.costs.resources import Resources

HOST_COPIES = ("d2h", "h2d")


class SmState:
    """Reserved SMs and HBM shares per rank; `active` is False when no task reserves SMs."""

    def __init__(self, tasks: Sequence[Task], model: Resources, gpu_name: str):
        self.model = model
        # per task index: the SMs it holds (its own, or costs.resources.comm_sms for a
        # communication task that names none)
        self.sms = [t.sms or (model.comm_sms if t.kind in COMM_KINDS else 0) for t in tasks]
        self.active = any(k > 0 for k in self.sms)
        if self.active:
            S = model.sms
            for t, k in zip(tasks, self.sms):
                if k <= 0:
                    continue
                if S is None:
                    raise ConfigError(
                        f"task {t.id!r}: reserves {k} SMs but the topology's gpu names no "
                        f"SM count (add gpu.sms)"
                    )
                if k > S:
                    raise ConfigError(
                        f"task {t.id!r}: reserves {k} SMs but the GPU ({gpu_name}) has {S}"
                    )
        self.held: dict[int, int] = defaultdict(int)  # rank -> SMs held
        self.share: dict[int, float] = defaultdict(float)  # rank -> HBM share taken
        self.task_share: dict[int, float] = {}  # task index -> its share while it runs

    @staticmethod
    def slowed(t: Task) -> bool:
        return t.sms == 0 and t.kind not in COMM_KINDS and t.kind not in HOST_COPIES

    def hold(self, i: int, t: Task, share: float) -> None:
        self.held[t.rank] += self.sms[i]
        self.share[t.rank] += share
        self.task_share[i] = share

    def release(self, i: int, t: Task) -> None:
        self.held[t.rank] -= self.sms[i]
        self.share[t.rank] -= self.task_share.pop(i, 0.0)
        if self.held[t.rank] <= 0:  # no float residue once the last one ends
            self.held[t.rank], self.share[t.rank] = 0, 0.0

    def speed(self, t: Task) -> float:
        """Relative speed of task t now (1 unless it is slowed and SMs are held beside it)."""
        if not self.slowed(t):
            return 1.0
        k = self.held[t.rank]
        return 1.0 if k <= 0 else self.model.speed(k, self.share[t.rank])
