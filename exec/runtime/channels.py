"""Communicators for a task graph: one process group per *channel*.

A channel is the set of (rank, stream) pairs that issue a communication task: a collective's
member ranks together with the stream each member runs it on, or the two ends of a send/recv.
Every channel gets its own process group, so

- concurrent streams never share a communicator: gloo collectives issued from two threads on
  one group can mismatch or deadlock, and NCCL requires one issue order per communicator;
- on each member, a channel is used by exactly one stream, whose program order is the issue
  order; graph validation (stream order + rendezvous acyclicity) makes that order the same
  on every member, which is the NCCL rule "same order on every rank per communicator".

`dist.new_group` is itself collective over the whole world, so every rank creates the
channels of the whole graph in one deterministic order (sorted keys), members or not.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from exec.errors import ExecError
from sim.core.graph import Task, TaskGraph
from sim.core.kinds import COLLECTIVE_KINDS, P2P_KINDS

# ("coll", group ranks, stream of each member in group order) or
# ("p2p", (low rank, its stream), (high rank, its stream))
ChannelKey = tuple[Any, ...]


@dataclass
class ChannelPlan:
    """Which channel each communication task uses, and the p2p tag that pairs send and recv."""

    of_task: dict[str, ChannelKey]
    keys: list[ChannelKey]  # creation order, identical on every rank
    p2p_tag: dict[str, int]  # coll id of a send/recv pair -> tag (gloo matches on it)
    peers: dict[str, list[Task]]  # coll id -> member tasks on every rank (for split sizes)


def plan_channels(graph: TaskGraph) -> ChannelPlan:
    members: dict[str, list[Task]] = defaultdict(list)
    for t in graph:
        if t.kind in COLLECTIVE_KINDS or t.kind in P2P_KINDS:
            members[t.coll].append(t)  # type: ignore[index]
    of_task: dict[str, ChannelKey] = {}
    p2p_colls: list[str] = []
    for cid, tasks in members.items():
        first = tasks[0]
        if first.kind in P2P_KINDS:
            if len(tasks) != 2:
                raise ExecError(f"send/recv {cid!r}: expected a matched pair, got {len(tasks)}")
            ends = sorted((t.rank, t.stream) for t in tasks)
            key: ChannelKey = ("p2p", ends[0], ends[1])
            p2p_colls.append(cid)
        else:
            # A member without its task only occurs in graphs loaded with validate=False; it
            # gets the first member's stream so every rank still derives the same key.
            by_rank = {t.rank: t.stream for t in tasks}
            key = (
                "coll",
                tuple(first.group or ()),
                tuple(by_rank.get(r, first.stream) for r in first.group or ()),
            )
        for t in tasks:
            of_task[t.id] = key
    keys = sorted(set(of_task.values()), key=repr)
    tags = {cid: i + 1 for i, cid in enumerate(sorted(p2p_colls))}
    return ChannelPlan(of_task, keys, tags, dict(members))


def channel_ranks(key: ChannelKey) -> list[int]:
    if key[0] == "p2p":
        return [key[1][0], key[2][0]]
    return list(key[1])


def create_groups(plan: ChannelPlan, timeout_s: float, backend: str | None = None) -> dict:
    """One process group per channel, created in `plan.keys` order (call on every rank).

    The groups' own timeout also bounds connection setup, which waits for the slowest rank
    to start; operations are bounded by the caller's `timeout_s` when it waits on them.
    """
    import torch.distributed as dist

    from exec.runtime.timeouts import SETUP_TIMEOUT_S

    timeout = timedelta(seconds=max(timeout_s, SETUP_TIMEOUT_S))
    groups = {}
    for key in plan.keys:
        ranks = channel_ranks(key)
        groups[key] = dist.new_group(ranks, timeout=timeout, backend=backend)
    return groups
