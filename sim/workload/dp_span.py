"""Collectives that span the data-parallel replicas (gradient reduction), in a graph of one.

Strategies build the graph of ONE replica (ranks 0..mp-1) and the simulator lays it over the
others (`replicate`, or the symmetric run that builds none of them). A gradient all-reduce is
the one collective whose members are in every replica. In the replica's graph it is written
with its replica-local members and the tag `dp_span: true`; its real group is those members'
ranks in every replica, and every replica's copy is the same collective (one coll id). With
one replica the tag changes nothing, so the replica's graph is a valid graph on its own.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from sim.core.graph import Task, TaskGraph

TAG = "dp_span"
_REPLICA_PREFIX = re.compile(r"^dp\d+/")


def spans(t: Task) -> bool:
    return bool(t.tags.get(TAG)) and t.group is not None


def global_group(local: list[int], ranks: np.ndarray) -> list[int]:
    """The members in every replica: ranks[d, i] is replica d's global rank of local i."""
    return sorted(int(x) for x in ranks[:, np.asarray(local, dtype=np.int64)].ravel())


def spread(graph: TaskGraph, mp: int) -> TaskGraph:
    """A graph laid over replicas of `mp` consecutive ranks (`replicate`: ids and coll ids
    prefixed `dp<d>/`, groups the replica's) with its dp-spanning collectives made one
    collective over every replica: group widened, the replica prefix dropped from the coll
    id. Changes the graph in place and returns it."""
    D = graph.world_size // mp
    if D <= 1:
        return graph
    ranks = np.arange(D * mp).reshape(D, mp)
    widened: dict[int, list[int]] = {}  # builders share group lists: one widened list each
    for tid, t in list(graph.tasks.items()):
        if not spans(t):
            continue
        assert t.group is not None and t.coll is not None
        group = widened.get(id(t.group))
        if group is None:
            group = widened[id(t.group)] = global_group([x % mp for x in t.group], ranks)
        graph.tasks[tid] = replace(t, group=group, coll=_REPLICA_PREFIX.sub("", t.coll))
    return graph
