"""The cheapest path between two devices of a node template, without networkx.

A node has tens of devices, so Dijkstra's search over a heap in plain Python is all routing
inside it needs, and `import networkx` (~0.1 s) stays out of every run. Ties between paths
of equal cost (four NVSwitches between two GPUs) are broken the same way every time: the
first settled, with neighbours tried in the order their links were added. On every preset
that is the route networkx chose before (`tests/test_node_routes.py`), so no result moved.
"""

from __future__ import annotations

from collections.abc import Container
from heapq import heappop, heappush
from itertools import count
from typing import Any

Adjacency = dict[Any, dict[Any, float]]  # node -> {neighbour: edge weight}, insertion-ordered


class NoPath(Exception):
    pass


def add_edge(succ: Adjacency, pred: Adjacency, u: Any, v: Any, weight: float) -> None:
    """Insert or re-weight the edge u -> v, as `DiGraph.add_edge` orders its dicts (an
    existing edge keeps its place)."""
    succ.setdefault(u, {})[v] = weight
    pred.setdefault(v, {})[u] = weight
    succ.setdefault(v, {})
    pred.setdefault(u, {})


def cheapest_path(
    succ: Adjacency, pred: Adjacency, source: Any, target: Any, blocked: Container[Any] = ()
) -> list[Any]:
    """The nodes of the cheapest path from `source` to `target` through no `blocked` node;
    NoPath where there is none. (`pred` is the reverse adjacency; the search runs forward.)"""
    best: dict[Any, float] = {source: 0.0}
    came: dict[Any, Any] = {source: None}
    done: set[Any] = set()
    order = count()  # equal costs leave the heap in the order they entered it
    heap: list[tuple[float, int, Any]] = [(0.0, next(order), source)]
    while heap:
        cost, _, here = heappop(heap)
        if here in done:
            continue
        if here == target:
            path = [here]
            while came[path[-1]] is not None:
                path.append(came[path[-1]])
            return path[::-1]
        done.add(here)
        for nxt, weight in succ.get(here, {}).items():
            if nxt in blocked or nxt in done:
                continue
            c = cost + weight
            if c < best.get(nxt, float("inf")):
                best[nxt], came[nxt] = c, here
                heappush(heap, (c, next(order), nxt))
    raise NoPath(f"no path from {source} to {target}")
