"""One run's files: a set of per-rank Kineto traces checked to be one run's, every rank's,
and the profiler step they have in common.

A folder may hold several runs' traces, or a rank's file may be missing; merged, they would
replay as one world that never ran. The files carry what tells runs apart: their rank and
world size (`distributedInfo`; the backend), and their times (one run's ranks step together,
another run's steps lie seconds or hours away). Each check is a one-line error naming the
files and ranks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError

STEP = re.compile(r"^ProfilerStep#(\d+)$")


def _run_of(doc: dict[str, Any]) -> tuple[Any, ...] | None:
    """What the files of one run share (`distributedInfo`): backend and world size; None
    where the file has none. (Process groups differ between the ranks of one run: each
    lists the subgroups it belongs to.)"""
    info = doc.get("distributedInfo")
    if not isinstance(info, dict):
        return None
    return (info.get("backend"), info.get("world_size"))


def one_run(docs: list[tuple[Path, dict[str, Any]]], ranks: list[int]) -> int | None:
    """The recorded world size of a set of per-rank files, checked to be one run's: one
    file per rank, the same backend and world size, every rank present
    (a single rank's file of a larger world is one rank's replay, said in the meta)."""
    where = [f"{p} (rank {r})" for (p, _), r in zip(docs, ranks)]
    for r in sorted(set(ranks)):
        same = [w for w, q in zip(where, ranks) if q == r]
        if len(same) > 1:
            raise ConfigError(
                f"traces: two files of rank {r}: {', '.join(same)}; a replay takes one run's "
                "files, one per rank (a folder holding several runs?)"
            )
    runs = [_run_of(d) for _, d in docs]
    if len(docs) > 1 and len(set(runs)) > 1:
        first = runs[0]
        odd = next(i for i, r in enumerate(runs) if r != first)
        other = runs[odd]
        what = _differs(first, other) if first and other else "no distributedInfo in one"
        raise ConfigError(
            f"traces: {where[odd]} is not of the run of {where[0]} ({what}); a replay takes "
            "one run's files, one per rank (a folder holding several runs?)"
        )
    sizes = {r[1] for r in runs if r is not None}
    world = next(iter(sizes)) if len(sizes) == 1 else None
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        return None
    beyond = [w for w, r in zip(where, ranks) if r >= world]
    if beyond:
        raise ConfigError(f"trace {beyond[0]}: rank outside the recorded world_size {world}")
    missing = sorted(set(range(world)) - set(ranks))
    if len(docs) > 1 and missing:
        raise ConfigError(
            f"traces {', '.join(where)}: rank(s) {missing} of world_size {world} missing; give "
            "every rank's file (or one rank's alone)"
        )
    return world


def _differs(a: tuple[Any, ...], b: tuple[Any, ...]) -> str:
    """What tells two files' runs apart."""
    if a[0] != b[0]:
        return f"backend {a[0]} vs {b[0]}"
    return f"world_size {a[1]} vs {b[1]}"


def overlapping(
    docs: list[tuple[Path, dict[str, Any]]], ranks: list[int], step: int | None
) -> None:
    """The files' steps (or whole spans) overlap in time, as one run's ranks do: a file
    recorded seconds or hours apart from the others is another run."""
    spans = []
    for (p, doc), r in zip(docs, ranks):
        s = steps(doc).get(step) if step is not None else None
        if s is not None:
            spans.append((float(s["ts"]), float(s["ts"]) + float(s.get("dur", 0)), p, r))
        else:
            xs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "ts" in e]
            lo = min(float(e["ts"]) for e in xs)
            spans.append((lo, max(float(e["ts"]) + float(e.get("dur", 0)) for e in xs), p, r))
    late = max(spans, key=lambda s: s[0])
    early = min(spans, key=lambda s: s[1])
    if late[0] > early[1]:
        what = f"ProfilerStep#{step}" if step is not None else "events"
        raise ConfigError(
            f"traces: {late[2]} (rank {late[3]}) starts its {what} "
            f"{(late[0] - early[1]) * 1e-6:.3g} s after {early[2]} (rank {early[3]}) ends its "
            "own; not one run (a folder holding several runs?)"
        )


def steps(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """ProfilerStep#N -> its host-side event, of one file.

    On a GPU, Kineto writes each step twice: the host's annotation (`user_annotation`,
    the step as the program ran it) and its projection on the device (`gpu_user_annotation`,
    from the step's first kernel to a point that need not be its last: on an H200 it covered
    5.0 of the step's 13.1 ms, reports/gpu-h200-2026-11-27). The step is the host's."""
    out: dict[int, dict[str, Any]] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and isinstance(e.get("name"), str):
            m = STEP.match(e["name"])
            if m and not str(e.get("cat", "")).startswith("gpu_"):
                out[int(m.group(1))] = e
    return out


def common_step(docs: list[tuple[Path, dict[str, Any]]], step: int | None) -> int | None:
    """The step to replay: `step` (every file must have it), else the first all have."""
    have = [set(steps(d)) for _, d in docs]
    if step is not None:
        for (p, _), s in zip(docs, have):
            if step not in s:
                raise ConfigError(
                    f"trace {p}: has no ProfilerStep#{step} (it has {sorted(s) or 'none'})"
                )
        return step
    if not any(have):
        return None  # no step annotations: the whole files
    common = set.intersection(*have)
    if not common:
        raise ConfigError(
            "traces: no ProfilerStep#N common to every file "
            f"({', '.join(f'{p}: {sorted(s)}' for (p, _), s in zip(docs, have))})"
        )
    return min(common)
