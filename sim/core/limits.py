"""Size limits: the bounds that keep a run from working for hours or running out of memory.

Every input that makes the simulator do work in proportion to a number (nodes, jitter replicas,
tasks, a routing matrix) is checked against a limit before that work starts, and the error
names the limit and how to raise it: `limits: {max_ranks: N}` in a run config, or
`--limit max_ranks=N` on the command line. The defaults sit well above what the benchmarks
run (16,384 GPUs as EP 64 x DP 256 simulate as 8 ranks; 2,048 ranks fully simulated take about
a minute) and well below what exhausts a machine's memory.

`active()` is the set in force: `applied(limits)` sets it for a block (the API does it per run),
so that code far from the config (the task graph growing in a builder, a topology's link
arrays) checks the same numbers without passing them through every signature.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from typing import Any

from sim.core.errors import ConfigError


@dataclass(frozen=True)
class Limits:
    """Size limits of a run: each bounds what it would build or load (`check`)."""

    # GPUs of a topology (nodes x gpus_per_node): its link arrays grow with it (~72 links per
    # 8-GPU node), whether or not every rank is simulated
    max_world: int = 262_144
    # ranks whose tasks are built and simulated (a replicated layout builds every replica)
    max_ranks: int = 16_384
    # tasks of one graph, built or loaded; tasks x jitter replicas for the work of a run
    max_tasks: int = 2_000_000
    # jitter replicas: each is a whole simulation
    max_replicas: int = 1_000
    # entries of an array sized by the input (the routing matrix: GPUs x experts, per chunk;
    # a graph's all-to-allv splits, members x peers summed over its collectives)
    max_matrix: int = 50_000_000
    # flows of a collectives sweep: sizes x ranks x phases (a ring has a phase per rank): a
    # ring all-reduce over 2,048 ranks takes ~40 s per size on one core
    max_flows: int = 2**25
    # flows simulated one by one, summed over a run's all-to-alls: a skewed exchange (or
    # fidelity: flow) has P(P-1) of them, each finish re-solving shared rates; one
    # forward layer over 256 GPUs takes ~16 s of CPU exact (benchmarks/skewed_scale.py)
    max_skewed_flows: int = 2**17
    # memory of the all-to-all group's P x P exchange, estimated before anything is built:
    # P x P rank pairs x what the strategy keeps per pair, in units of ~64 bytes
    # (sim.strategies.pair_weight; `RunConfig.workload_for` checks it). A uniform exchange
    # keeps ~10 bytes a pair (1); per-peer all-to-allv splits and a derived alpha-beta fit
    # (PipeMoE's selector) far more: megatron_ep 81 on the demo (1.4 GB peak RSS at 512 GPUs,
    # 5.3 GB at 1,024), fastermoe 141 (2.3 GB at 512), deepep 9, pipemoe 9 (2.3 GB at 2,048).
    # The default (~3.8 GB of estimate) admits sequential/pipelined/tutel up to ~7,700 GPUs in
    # one group, megatron_ep to ~860, fastermoe to ~650, deepep and pipemoe to ~2,580.
    max_pairs: int = 60_000_000

    def check(self, name: str, value: int, what: str) -> None:
        """ConfigError if `value` is over the limit `name`; `what` says what was counted."""
        limit = getattr(self, name)
        if value > limit:
            raise ConfigError(
                f"{what}: {value:,} is over the limit of {limit:,} (limits.{name}); raise it "
                f"with `limits: {{{name}: N}}` in the run config or --limit {name}=N"
            )

    def check_run(
        self, ranks: int, source: str, tasks: int | None = None, replicas: int = 1
    ) -> None:
        """The guards of one run before its work starts: `ranks` whose tasks are built and
        simulated, jitter `replicas`, and (once the graph exists) `tasks` x replicas."""
        self.check("max_ranks", ranks, f"{source}: ranks to build and simulate")
        self.check("max_replicas", replicas, f"{source}: jitter replicas")
        if tasks is not None:
            what = f"{source}: tasks to simulate ({tasks:,} x {replicas} replicas)"
            self.check("max_tasks", tasks * replicas, what)

    def merged(self, raw: dict[str, Any] | None) -> Limits:
        """These limits with the given ones replaced (values checked by the caller's schema)."""
        return replace(self, **(raw or {})) if raw else self


NAMES = tuple(f.name for f in fields(Limits))
DEFAULT = Limits()
_ACTIVE: contextvars.ContextVar[Limits] = contextvars.ContextVar("moesim_limits", default=DEFAULT)


def active() -> Limits:
    return _ACTIVE.get()


@contextlib.contextmanager
def applied(limits: Limits | None) -> Iterator[Limits]:
    """`limits` in force inside the block (None: leave the current ones)."""
    if limits is None:
        yield active()
        return
    previous = _ACTIVE.set(limits)
    try:
        yield limits
    finally:
        _ACTIVE.reset(previous)


def parse(items: list[str] | None, source: str = "--limit") -> dict[str, int]:
    """`--limit NAME=N` strings as {name: N}: known names, positive integers (1e6, 2_000 and
    16,384 are read as integers)."""
    out: dict[str, int] = {}
    for item in items or []:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or name not in NAMES:
            raise ConfigError(
                f"{source} {item!r}: expected NAME=N with NAME one of {', '.join(NAMES)}"
            )
        value = _integer(text.strip().replace("_", "").replace(",", ""))
        if value is None or value < 1:
            raise ConfigError(f"{source} {name}: expected a positive integer, got {text!r}")
        out[name] = value
    return out


def _integer(text: str) -> int | None:
    if text.isdigit():
        return int(text) if len(text) <= 18 else None
    try:
        f = float(text)
    except ValueError:
        return None
    return int(f) if f.is_integer() and 0 < f < 1e18 else None


def skewed_flows(graph: Any, per_flow: bool = False) -> int:
    """Flows that a run of `graph` simulates one by one: P(P-1) per all-to-allv whose splits
    are not all equal (a uniform exchange is simulated as bundles), and per all-to-all too
    when `per_flow` (costs.fidelity: flow)."""
    members: dict[str, list[Any]] = {}
    for t in graph:
        if t.kind == "all_to_allv" or (per_flow and t.kind == "all_to_all"):
            members.setdefault(t.coll, []).append(t)
    total = 0
    for tasks in members.values():
        p = len(tasks[0].group or ())
        if per_flow or tasks[0].kind == "all_to_all":
            total += p * (p - 1)
            continue
        if _unequal_off_diagonal(tasks):
            total += p * (p - 1)
    return total


def _unequal_off_diagonal(tasks: list[Any]) -> bool:
    """Whether an all-to-allv's members send different sizes to their peers (what they keep
    for themselves does not count)."""
    import numpy as np

    group = list(tasks[0].group or ())
    if not group or any(t.split is None or len(t.split) != len(group) for t in tasks):
        return False
    pos = {r: i for i, r in enumerate(group)}
    splits = np.array([t.split for t in tasks], dtype=float)
    splits[np.arange(len(tasks)), [pos.get(t.rank, -1) for t in tasks]] = np.nan
    peers = splits[~np.isnan(splits)]
    return bool(peers.size) and bool(peers.min() != peers.max())
