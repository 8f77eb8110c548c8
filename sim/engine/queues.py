"""Hardware queues: how a rank's streams reach the GPU (CUDA_DEVICE_MAX_CONNECTIONS).

A GPU takes work from a host through a fixed number of hardware queues (CUDA's "connections",
8 by default). CUDA spreads a process's streams over them; we map them round-robin in the order
of each stream's first task in the graph (stream 1 to queue 0, stream 2 to queue 1, ...,
stream 9 to queue 0 again with the default 8). A queue is first in, first out in host issue
order (the order the rank's tasks were added to the graph, `sim.core.graph`): a kernel cannot
start before every kernel issued earlier on its queue has started, so a kernel waiting for its
dependencies blocks the independent kernels of other streams queued behind it (head-of-line
blocking). With `max_connections: 1` every stream of a rank shares one queue, and launches
of different streams serialise in issue order, which is why Megatron-Core's overlap needs
more than one.

The next kernel on a queue starts only once every block of the one before has been
dispatched to an SM (CUDA C Programming Guide, implicit synchronisation on devices with one
work queue: an operation "can start executing only when all thread blocks of all prior kernel
launches ... have started executing"). A communication kernel or one that reserves its SMs
fits in one wave, so its blocks are all out when it starts. A compute kernel of many waves
(GEMMs and elementwise kernels over a layer's tokens) sends its last wave near its end: on a
queue that several streams share it keeps the queue until it ends (taken as its end: the
last wave is short beside the kernel). The GEMM model's waves tell a GEMM of one wave, which
frees its queue when it starts; any other compute kernel is taken to be of many.

A rank with no more streams than queues has a queue per stream, and a stream already runs in
issue order, so nothing changes: `HardwareQueues.build` returns None then, and the engine is
exactly as without queues.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sim.core.graph import Task
from sim.core.kinds import COMPUTE_KINDS


def _fills_gpu(t: Task) -> bool:
    """A compute kernel whose blocks outnumber one wave: all but those that reserve SMs."""
    return t.kind in COMPUTE_KINDS and t.sms == 0


class HardwareQueues:
    """Per (rank, queue): its tasks in issue order and how many of them have been issued."""

    def __init__(
        self,
        queue_of: list[int],
        order: list[list[int]],
        stream_of: list[int],
        hold: list[bool] | None = None,
    ):
        self.queue_of = queue_of  # task index -> queue id
        # task index -> whether it keeps its queue until it ends (see `holds`)
        self.hold = hold if hold is not None else [False] * len(queue_of)
        self.order = order  # queue id -> task indices in issue order
        self.pos = [0] * len(queue_of)  # task index -> its place on its queue
        for seq in order:
            for p, i in enumerate(seq):
                self.pos[i] = p
        self.head = [0] * len(order)  # queue id -> tasks issued so far
        self.stream_of = stream_of

    @classmethod
    def build(
        cls,
        tasks: Sequence[Task],
        stream_of: list[int],
        stream_keys: list[tuple[int, str]],
        max_connections: int,
        waves: Callable[[Task], int | None] | None = None,
    ) -> HardwareQueues | None:
        """Queues for these tasks, or None where every rank has a queue per stream. `waves`:
        a kernel's waves of blocks where the cost model knows them (one wave frees its queue
        when it starts)."""
        per_rank: dict[int, int] = {}
        for rank, _ in stream_keys:
            per_rank[rank] = per_rank.get(rank, 0) + 1
        if all(n <= max_connections for n in per_rank.values()):
            return None
        queue_id: dict[tuple[int, int], int] = {}  # (rank, slot) -> queue id
        slot_of_stream: dict[int, int] = {}
        used: dict[int, int] = {}  # rank -> streams seen so far
        queue_of: list[int] = []
        order: list[list[int]] = []
        for i, t in enumerate(tasks):
            s = stream_of[i]
            if s not in slot_of_stream:  # round-robin in order of first use
                slot_of_stream[s] = used.get(t.rank, 0) % max_connections
                used[t.rank] = used.get(t.rank, 0) + 1
            key = (t.rank, slot_of_stream[s])
            if key not in queue_id:
                queue_id[key] = len(order)
                order.append([])
            q = queue_id[key]
            queue_of.append(q)
            order[q].append(i)
        shared = [len({stream_of[j] for j in seq}) > 1 for seq in order]
        hold = [
            shared[queue_of[i]] and _fills_gpu(t) and (waves is None or (waves(t) or 2) > 1)
            for i, t in enumerate(tasks)
        ]
        return cls(queue_of, order, stream_of, hold)

    def holds(self, i: int) -> bool:
        """Whether task i keeps its queue until it ends: a compute kernel on a queue that
        several streams share (module docstring: a grid's blocks all leave before the next
        grid's; a kernel of many waves sends its last ones near its end)."""
        return self.hold[i]

    def ready(self, i: int) -> bool:
        """Whether every task issued before task i on its queue has been issued."""
        return self.pos[i] == self.head[self.queue_of[i]]

    def issue(self, i: int) -> int | None:
        """Task i leaves its queue; the stream of the task now at the head (to try), if any."""
        q = self.queue_of[i]
        self.head[q] += 1
        seq = self.order[q]
        return self.stream_of[seq[self.head[q]]] if self.head[q] < len(seq) else None

    def blocker(self, i: int) -> int | None:
        """The task at the head of task i's queue when that is not i (for a deadlock report)."""
        q = self.queue_of[i]
        h = self.head[q]
        return self.order[q][h] if h < len(self.order[q]) and self.order[q][h] != i else None
