"""Strategies: builders from (MoE layer, params, cluster) to a TaskGraph. They never touch
the engine.

Each module defines `STRATEGY`, a `sim.strategies.base.Strategy`: its name, `Params` (a
pydantic model: its parameters' types, defaults and help), `build(layer, params, passes,
cluster=None) -> TaskGraph` and `real_layer` (the executor's layer by name, None: no real
form); `cluster` (topology and cost model) is what a strategy's own selector reads
(PipeMoE's Theorem 1), None where unknown. `STRATEGY_LIST` is the one list of them: every
other part (config checks and schema, summaries, compare, sweep, the executor) reads it.

Hooks for a model of many blocks (`build(..., blocks=...)`), all optional:
- `plan(layer, params, blocks, cluster) -> params`: model-wide choices made before the layer
  graph is built (Lancet's partition DP);
- `model_pass(graph, params, cluster) -> graph`: a pass over the spliced model (Lancet);
- `build_model(layer, params, blocks, passes, cluster) ->
  TaskGraph`: the strategy's graph is already the whole model or step (a schedule across
  layers and micro-batches: Megatron's merged 1F1B, DualPipe), so it is returned as it is,
  never spliced into `sim.strategies.model`'s per-layer model.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph
from sim.strategies.base import Strategy
from sim.strategies.resolved import Resolved
from sim.workload import dp_span
from sim.workload.blocks import BlockModel
from sim.workload.moe import MoELayer
from sim.workload.parallel import ParallelLayout, replicate

# The strategies' modules (in sim.strategies), each named as its STRATEGY is, in
# STRATEGY_LIST's order. A run imports only the module of the strategy it names
# (`STRATEGIES[name]`): the builders of the others and their Params models are a third of a
# small `moesim simulate`'s start-up. STRATEGY_LIST, built on first use (`__getattr__`),
# imports them all, as does going over STRATEGIES.
_MODULES = (
    "sequential",
    "pipelined",
    "pipemoe",
    "tutel",
    "ted",
    "fastermoe",
    "mpipemoe",
    "lancet",
    "parm",
    "deepep",
    "megatron_ep",
    "dualpipe",
)

STRATEGY_LIST: list[Strategy]  # every strategy, in _MODULES' order (bound by __getattr__)


def __getattr__(name: str) -> Any:
    """`STRATEGY_LIST` on first use (PEP 562), every strategy module imported then."""
    if name == "STRATEGY_LIST":
        global STRATEGY_LIST
        STRATEGY_LIST = [_strategy(m) for m in _MODULES]
        return STRATEGY_LIST
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _listed() -> list[Strategy]:
    """STRATEGY_LIST (a global name read in this module does not reach `__getattr__`)."""
    found: list[Strategy] | None = globals().get("STRATEGY_LIST")
    return found if found is not None else __getattr__("STRATEGY_LIST")


def _strategy(module: str) -> Strategy:
    strat: Strategy = importlib.import_module(f"{__name__}.{module}").STRATEGY
    return strat


class _ByName(Mapping[str, Strategy]):
    """STRATEGY_LIST by name, read afresh on every access (a test may swap the list). Until
    the list is first read, a name looks up its own module only."""

    def _now(self) -> dict[str, Strategy]:
        return {s.name: s for s in _listed()}

    def __getitem__(self, k: str) -> Strategy:
        if "STRATEGY_LIST" not in globals() and k in _MODULES:
            return _strategy(k)
        return self._now()[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())


STRATEGIES: Mapping[str, Strategy] = _ByName()


@dataclass(frozen=True)
class Cluster:
    """The topology and cost model a strategy's selector reads."""

    topology: Any  # sim.hardware.topology.Topology
    costs: Any  # sim.hardware.costs.CostModel


# What a run keeps per rank pair of its all-to-all group, in units of PAIR_BYTES: sim.config
# checks P x P x this (`pair_weight`) against limits.max_pairs before anything is built. A
# strategy's own `pair_weight(layer, params, passes, blocks)` gives it where it keeps per-peer
# lists (all-to-allv splits) or derives a fit over the group's P x P flows (a selector's
# alpha-beta); a uniform exchange keeps ~10 bytes a pair (routes, bundles): 1. Measured as the
# slope of the demo's peak RSS in P x P (issue 28; README "At scale").
PAIR_BYTES = 64
# an alpha-beta fit derived from the flow model (sim.hardware.costs.derived) times the group's
# P x P flows at once: ~500 bytes a pair, transient (PipeMoE's selector, costs.network:
# collective)
DERIVED_FIT_WEIGHT = 8


def pair_weight(
    name: str,
    layer: MoELayer,
    params: dict[str, Any],
    passes: tuple[str, ...],
    blocks: BlockModel | None = None,
) -> int:
    """PAIR_BYTES units the run of strategy `name` keeps per rank pair of its group (at least
    1); an unknown strategy counts 1 (its own check names it)."""
    strat = STRATEGIES.get(name)
    if strat is None or strat.pair_weight is None:
        return 1
    weight = strat.pair_weight(layer, {**strat.defaults, **params}, tuple(passes), blocks)
    return max(1, math.ceil(weight))


def named(name: str) -> Strategy:
    """The strategy called `name`; a ConfigError naming the known ones where there is none."""
    strat = STRATEGIES.get(name)
    if strat is None:
        raise ConfigError(f"strategy.name: unknown strategy {name!r} (known: {sorted(STRATEGIES)})")
    return strat


def resolve_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    defaults = named(name).defaults
    unknown = set(params) - set(defaults)
    if unknown:
        raise ConfigError(
            f"strategy: unknown parameter(s) {sorted(unknown)} for {name!r} "
            f"(it takes {sorted(defaults) or 'none'})"
        )
    return {**defaults, **params}


def resolve_auto(
    name: str,
    layer: MoELayer,
    params: dict[str, Any],
    passes: tuple[str, ...],
    cluster: Cluster | None = None,
) -> Resolved:
    """The strategy's parameters as its builder resolves them (the same function): defaults
    filled in and every `auto` replaced by its selector's choice on `cluster` (the executor
    runs these, so that it runs what the simulator builds)."""
    full = resolve_params(name, params)
    fn = STRATEGIES[name].resolve
    return Resolved(full) if fn is None else fn(layer, full, passes, cluster)


def build(
    name: str,
    layer: MoELayer,
    params: dict[str, Any],
    passes: tuple[str, ...],
    cluster: Cluster | None = None,
    layout: ParallelLayout | None = None,
    blocks: BlockModel | None = None,
) -> TaskGraph:
    """The strategy's graph of one data-parallel replica (`layer.world` ranks), laid over
    every replica of `layout` (None or dp = 1: the replica is the world). With `blocks`, the
    graph of the whole model, its MoE layers the strategy's (`sim.strategies.model`)."""
    full = resolve_params(name, params)
    strat = STRATEGIES[name]
    if blocks is not None and strat.build_model is not None:  # the graph is the model
        graph = strat.build_model(layer, full, blocks, passes, cluster)
        return _spread(_issued(_account(graph, name, layer, passes, blocks, full)), layout)
    if blocks is not None and strat.plan is not None:  # model-wide choices (Lancet)
        full = strat.plan(layer, full, blocks, cluster)
    graph = strat.build(layer, full, passes, cluster)
    if blocks is not None:
        from sim.strategies.model import build_model
        from sim.workload.routing import per_block

        own = {
            b: strat.build(lb, full, passes, cluster)
            for b, lb in per_block(layer, blocks.moe_blocks).items()
        }
        graph = build_model(blocks, layer, graph, passes, own)
        if strat.model_pass is not None:  # passes over the whole model (Lancet)
            graph = strat.model_pass(graph, full, cluster)
    return _spread(_issued(_account(graph, name, layer, passes, blocks, full)), layout)


def _issued(graph: TaskGraph) -> TaskGraph:
    """The graph with each rank's tasks in an order its host could issue them
    (`sim.core.issue`). The layer builders (and the model around them) add tasks stream by
    stream, since only stream order matters to their schedule; on shared hardware queues
    (`costs.resources.max_connections`) the order across streams is the host's, and a
    compute chunk added before the dispatch it waits for deadlocks the queue. Re-issued, a
    pipelined layer goes gate, encode, dispatch 0..r-1 (as far as its comm stream allows),
    then each expert chunk just before its combine: dispatch i before expert i before
    combine i. (Tutel's own code issues every expert chunk before the first combine, which
    on one queue holds each combine back to the last chunk's end; the interleaved order is
    the one a program written for one queue would use.) Where a builder's order is one a
    host could issue (Megatron's merged 1F1B and DualPipe's schedules, DeepEP's, Parm's),
    it is kept: their launch threads and host syncs follow it. The re-issued builders have
    a queue per stream with the default 8 queues, so their times there do not depend on
    the order (tests/golden)."""
    from sim.core.issue import in_issue_order

    return in_issue_order(graph)


def _account(
    graph: TaskGraph,
    name: str,
    layer: MoELayer,
    passes: tuple[str, ...],
    blocks: BlockModel | None,
    full: dict[str, Any],
) -> TaskGraph:
    """The graph with what every strategy's summary reports on its meta (one place, so no
    builder can leave it out): the layer's tokens routed / kept / dropped, the model-state
    bytes per GPU (sim.workload.accounting) and `params`, the strategy's parameters as
    built (`resolved_params`)."""
    from sim.workload.accounting import model_states, token_counts

    strat = STRATEGIES[name]
    meta = graph.meta
    par = meta.get("parallel")  # Parm's layout (a dict); Tutel's is a name ("p1")
    tp = meta.get("tp") or (par.get("tp") if isinstance(par, dict) else None) or 1  # TED, Parm
    if "layers" in meta:  # megatron_ep: its layers on every GPU; DualPipe: two chunks each
        moe_layers = int(meta["layers"]) * strat.layer_copies
    else:
        moe_layers = len(blocks.moe_blocks) if blocks is not None else 1
    # TED's TP groups lie inside the MoE layer: each of its EP groups holds all E experts
    copies = int(tp) if strat.layout_tp else 1
    meta["tokens_per_layer"] = token_counts(
        layer, dropless=strat.dropless or layer.dropless, shared_by=int(tp)
    )
    meta["model_states"] = model_states(layer, passes, moe_layers, copies)
    meta["params"] = resolved_params(full, meta)
    return graph


def resolved_params(full: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The parameters a graph was built with: the given ones and the defaults, each `auto`
    as the builder chose it (its meta's entry of the same name where it wrote one: a chosen
    degree, Tutel's parallelism); a builder's private keys (`_plan`) left out."""
    out = {}
    for k, v in full.items():
        if k.startswith("_"):
            continue
        chosen = meta.get(k)
        out[k] = chosen if chosen is not None and not isinstance(chosen, dict) else v
    return out


def _spread(graph: TaskGraph, layout: ParallelLayout | None) -> TaskGraph:
    """The replica's graph over every data-parallel replica of `layout`."""
    if layout is None:
        return graph
    return dp_span.spread(replicate(graph, layout), layout.replica)
