"""A simulated deadlock, reported as its cycle of waits.

When no event is left and tasks are not done, every one of them waits for another that is
not done either: a dependency, the task ahead of it on its stream, the task ahead of it on its
hardware queue (`sim.engine.queues`), the host sync its rank's launch thread waits on
(`sim.engine.launch`), or, once launched, the members of its collective that never launch.
Following one such wait from task to task must come back to a task already seen: that cycle
is the deadlock. The report is the chain from the first blocked stream into the cycle, one
line per link and at most `REPORT_LINES` of them, since at thousands of ranks a line per
blocked stream would bury the cause.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.engine.engine import Engine

REPORT_LINES = 8  # links of the chain of waits a report shows


def report(e: Engine) -> str:
    """The deadlock's message: a header, then the chain of waits into its cycle."""
    left = len(e.tasks) - e.done
    heads = [seq[e.head[s]] for s, seq in enumerate(e.stream_tasks) if e.head[s] < len(seq)]
    header = (
        f"simulated deadlock: {left} task(s) can never finish, {len(heads)} stream(s) "
        f"blocked; a cycle of waits (each line waits for the next):"
    )
    if not heads:
        return header
    lines: list[str] = []
    at: dict[int, int] = {}  # task index -> its line
    i: int | None = heads[0]
    while i is not None and i not in at:
        at[i] = len(lines)
        line, i = waits_for(e, i)
        lines.append(line)
    if i is None:  # not a deadlock's: every blocked task waits for another
        cycle_from = 0
    else:
        cycle_from = at[i]
        lines[-1] += f"  -- back to {e.tasks[i].id}: a cycle"
    # the cycle, after as much of the way from the first blocked stream into it as fits
    cycle = lines[cycle_from:]
    if len(cycle) > REPORT_LINES:
        hidden = len(cycle) - (REPORT_LINES - 1)
        cycle = [*cycle[: REPORT_LINES - 2], f"  ... {hidden} more link(s) ...", cycle[-1]]
    room = REPORT_LINES - len(cycle)
    lead = lines[:cycle_from][-room:] if room > 0 else []
    return "\n".join([header, *lead, *cycle])


def waits_for(e: Engine, i: int) -> tuple[str, int | None]:
    """One link: task i and what it waits for, and that task's index (None: nothing)."""
    t = e.tasks[i]
    who = f"  {t.id} (rank {t.rank}, {t.stream}):"
    if not math.isnan(e.start[i]):  # launched and not done: a collective's rendezvous
        members = e.coll_members.get(t.coll or "", [])
        absent = [m for m in members if math.isnan(e.start[m])]
        ranks = sorted(e.tasks[m].rank for m in absent)
        shown = ", ".join(map(str, ranks[:4]))
        if len(ranks) > 4:
            shown += f", ... {len(ranks)} in all"
        first = min(absent, key=lambda m: e.tasks[m].rank) if absent else None
        return f"{who} waits for rank(s) [{shown}] to launch {t.kind} {t.coll!r}", first
    s = e.stream_of[i]
    h = e.stream_tasks[s][e.head[s]]
    if h != i:
        return f"{who} waits for {e.tasks[h].id} ahead of it on its stream", h
    waiting = [d for d in t.deps if math.isnan(e.end[e.index[d]])]
    if waiting:
        return f"{who} waits for {waiting}", e.index[waiting[0]]
    sync = None if e.launch is None else e.launch.waits_on(i, t.rank)
    if sync is not None:
        return (
            f"{who} not launched: the host waits on host sync {e.tasks[sync].id}, "
            "which can never finish",
            sync,
        )
    ahead = None if e.queues is None else e.queues.blocker(i)
    if ahead is not None:
        n = e.costs.resources.max_connections
        return (
            f"{who} waits behind {e.tasks[ahead].id} on its hardware queue (max_connections {n})",
            ahead,
        )
    return f"{who} waits for nothing that could block it", None
