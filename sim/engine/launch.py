"""The host's launch thread: one serial resource per rank that issues its tasks.

A rank's tasks reach the GPU through one host thread that launches them in host issue order
(the order they were added to the graph, `sim.core.graph`; the same order the hardware queues
of `sim.engine.queues` use). A task cannot start before the thread has issued it. Issuing one
costs `costs.resources.launch_s` seconds of the thread's time (a CUDA kernel launch costs the
host a few microseconds; see `sim.hardware.costs.resources`; per task kind, an executor's
measured cost: `sim.hardware.costs.launch`), so a rank issues its tasks at 0, L, 2L, ...
however idle its GPU is. A task with `Task.host_sync` makes the host wait for
it: the thread issues nothing after it until it finishes (Megatron's all-to-allv needs its
split sizes on the host, a d2h of the token counts followed by a stream synchronize; DeepEP's
notify step busy-waits on the received counts). Kernels issued before the sync keep running
on the GPU; the ones after are launched late, which is the pitfall the overlap reference
names ("model the CPU thread as a serial resource").

With every launch free and no host-sync task, nothing waits: `LaunchThread.build` returns None
and the engine is exactly as without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sim.core.graph import Task
from sim.hardware.costs.launch import HostLaunch


class LaunchThread:
    """Per rank: its tasks in issue order, how many are issued, when the thread is free next
    and the host sync it waits on (if any)."""

    def __init__(
        self,
        tasks: Sequence[Task],
        launch: HostLaunch,
        clock: Callable[[], float],
        schedule: Callable[..., None],
        issued_cb: Callable[[int], None],
    ):
        self.cost = [launch.of(t) for t in tasks]  # host seconds to issue each task
        self.clock = clock  # the engine's simulated time
        self.schedule = schedule  # schedule(delay, fn, *args): the engine's timer
        self.issued_cb = issued_cb  # told each task index as it is issued
        self.sync = [t.host_sync for t in tasks]
        self.issued = [False] * len(tasks)
        self.order: dict[int, list[int]] = {}
        for i, t in enumerate(tasks):
            self.order.setdefault(t.rank, []).append(i)
        self.pos = dict.fromkeys(self.order, 0)
        self.free_at = dict.fromkeys(self.order, 0.0)
        self.blocked: dict[int, int | None] = dict.fromkeys(self.order)

    @classmethod
    def build(
        cls,
        tasks: Sequence[Task],
        launch: HostLaunch,
        clock: Callable[[], float],
        schedule: Callable[..., None],
        issued_cb: Callable[[int], None],
    ) -> LaunchThread | None:
        """The launch threads, or None when nothing would ever wait for them."""
        if launch.free and not any(t.host_sync for t in tasks):
            return None
        return cls(tasks, launch, clock, schedule, issued_cb)

    def start(self) -> None:
        for rank in self.order:
            self.advance(rank, self.clock())

    def advance(self, rank: int, now: float, woken: bool = False) -> None:
        """Issue what rank's thread can issue by `now`; wake up again when it is next free.
        `woken`: called by that wake-up, so the thread is free now whatever rounding says."""
        seq = self.order[rank]
        while self.pos[rank] < len(seq) and self.blocked[rank] is None:
            if not woken and self.free_at[rank] > now:
                self.schedule(self.free_at[rank] - now, self._wake, rank)
                return
            woken = False
            i = seq[self.pos[rank]]
            self.pos[rank] += 1
            self.issued[i] = True
            self.free_at[rank] = max(self.free_at[rank], now) + self.cost[i]
            if self.sync[i]:
                self.blocked[rank] = i
            self.issued_cb(i)

    def _wake(self, rank: int) -> None:
        self.advance(rank, self.clock(), woken=True)

    def finished(self, i: int, rank: int, now: float) -> None:
        """Task i ended: if the thread waits on it, it goes on issuing."""
        if self.blocked.get(rank) == i:
            self.blocked[rank] = None
            self.free_at[rank] = max(self.free_at[rank], now)
            self.advance(rank, now)

    def waits_on(self, i: int, rank: int) -> int | None:
        """The host sync that keeps task i from being issued (for a deadlock report)."""
        return None if self.issued[i] else self.blocked.get(rank)
