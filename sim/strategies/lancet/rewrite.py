"""Lancet's operator partition applied to a model's task graph (Sec. 5.2-5.3).

Per MoE block with a pipeline in the plan, the operators of its range are replaced, on every
rank, by k batch partitions (`plan.scale`: partition j holds its share of the sequences).
Partition j of an operator waits for partition j of its inputs where those are partitioned
too; the layer's own dispatch .. combine are already its k partitions (built with the
capacity-passing sizes, `capacity.partition_sizes`), so partition j of the encode feeds
dispatch j and partition j of the decode waits for combine j only. What lies outside the
range waits for every partition. The compute stream runs the range in the paper's stage
schedule: the stage before the dispatch for partition 0, 1, .., k-1, then the experts as they
arrive, then the stage after the combine partition by partition; the all-to-alls keep
Tutel's order on their stream. The backward is not partitioned (Lancet overlaps its
all-to-alls with weight gradients instead).
"""

from __future__ import annotations

from dataclasses import replace

from sim.core.graph import Task, TaskGraph
from sim.strategies.lancet.plan import Plan, fractions, scale


def part_id(tid: str, j: int) -> str:
    return f"{tid}.p{j}"


def partition_graph(graph: TaskGraph, plan: Plan, batch: int) -> TaskGraph:
    """A new graph with the plan's ranges partitioned (module docstring)."""
    if not plan.ranges:
        return graph
    k, fr = plan.k, fractions(batch, plan.k)
    group_of: dict[str, tuple[int, int, str]] = {}
    groups: dict[tuple[int, int, str], list[str]] = {}
    for rank in range(graph.world_size):
        for mb, (pre, post) in plan.ranges.items():
            for stage, steps in (("pre", pre), ("post", post)):
                ids = [f"r{rank}/L{b}/fwd/{s}" for b, s in steps]
                ids = [i for i in ids if i in graph.tasks]
                groups[(rank, mb, stage)] = ids
                group_of.update({i: (rank, mb, stage) for i in ids})

    def chunk(d: str) -> int | None:
        c = graph.tasks[d].tags.get("chunk")
        return None if c is None else int(c)

    def deps_of(t: Task, j: int | None) -> list[str]:
        out: list[str] = []
        for d in t.deps:
            if d in group_of:
                if j is not None:
                    out.append(part_id(d, j))
                else:
                    fwd_comm = t.is_comm and t.tags.get("phase") == "fwd"
                    c = chunk(t.id) if fwd_comm else None  # dispatch c: encode c
                    out += [part_id(d, c)] if c is not None else [part_id(d, i) for i in range(k)]
            elif j is not None and chunk(d) is not None and graph.tasks[d].is_comm:
                if chunk(d) == j:  # a combine chunk: partition j's own
                    out.append(d)
            else:
                out.append(d)
        return out

    new = TaskGraph(graph.world_size, meta=dict(graph.meta))
    done: set[tuple[int, int, str]] = set()
    for t in graph:
        key = group_of.get(t.id)
        if key is None:
            new.add(replace(t, deps=deps_of(t, None)))
            continue
        if key in done:
            continue
        done.add(key)
        for j in range(k):  # the stage, partition by partition
            for tid in groups[key]:
                src = graph.tasks[tid]
                p = scale(src, fr[j])
                last = j == k - 1  # buffers change hands when every partition is done
                new.add(
                    replace(
                        p,
                        id=part_id(tid, j),
                        deps=deps_of(src, j),
                        tags=dict(src.tags, part=j),
                        allocs=src.allocs if last else {},
                        frees=src.frees if last else [],
                    )
                )
    return new  # validated by the caller, after the dW pass
