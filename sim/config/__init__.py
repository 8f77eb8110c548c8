"""Run configurations (YAML): which layer, on which cluster, with which strategy and costs.

Every field is checked here, and an error names the field and what was expected, so that a
typo never turns into a silently different experiment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sim.config.routing_file import check_calibration_file, load_matrix_file
from sim.core import inputcache, limits
from sim.core.errors import ConfigError
from sim.core.limits import DEFAULT as DEFAULT_LIMITS
from sim.core.limits import Limits
from sim.hardware.topology import Topology
from sim.strategies import DERIVED_FIT_WEIGHT, STRATEGIES, named, pair_weight, resolve_params
from sim.workload.blocks import BlockModel, expand_preset
from sim.workload.moe import MoELayer
from sim.workload.parallel import ParallelLayout, from_spec

if TYPE_CHECKING:
    from sim.config.run_core import RunCore

# Sections a config may leave out, whose schemas are most of RunSpec's: `run_spec` types the
# ones a config leaves out or empty as Any, so their validators are built (`defer_build`) only
# when filled. Exact: an absent key is never validated, and {} is valid for each (tests).
OPTIONAL_SECTIONS = ("fabric", "parallel", "costs", "output", "limits")


def run_spec(raw: Any) -> type[RunCore]:
    """RunSpec, with the OPTIONAL_SECTIONS that `raw` leaves out or empty typed Any; where it
    leaves them all out, RunCore (RunSpec's base, which types them all Any), so that
    sim.config.run_schema, the sections' models, is not even imported."""
    if not isinstance(raw, dict):
        return _without(frozenset())
    unused = (k for k in OPTIONAL_SECTIONS if k not in raw or type(raw[k]) is dict and not raw[k])
    return _without(frozenset(unused))


@cache
def _without(sections: frozenset[str]) -> type[RunCore]:
    from sim.config.run_core import RunCore

    if sections == frozenset(OPTIONAL_SECTIONS):
        return RunCore
    from pydantic import create_model

    from sim.config.run_schema import RunSpec

    unchecked: Any = (Any, None)
    fields = dict.fromkeys(sorted(sections), unchecked)
    if not fields:
        return RunSpec
    return create_model("RunSpec", __base__=RunSpec, __module__=RunSpec.__module__, **fields)


@dataclass
class RunConfig:
    """A checked run config: layer, cluster, strategy, passes, costs, outputs."""

    topology: str
    nodes: int | None
    model: dict[str, Any]
    strategy: str
    strategy_params: dict[str, Any]
    passes: tuple[str, ...]
    costs: dict[str, Any] = field(default_factory=dict)
    output: dict[str, Any] = field(default_factory=dict)
    source: str = "<dict>"
    fabric: dict[str, Any] = field(default_factory=dict)  # overrides of the topology's fabric
    parallel: dict[str, Any] | None = None  # `parallel: {ep, dp, tp, esp}`; None: one EP group
    limits: dict[str, int] = field(default_factory=dict)  # size limits raised (sim.core.limits)

    @classmethod
    def from_dict(cls, raw: Any, source: str = "<dict>") -> RunConfig:
        """Checked against the schema (`sim.config.run_schema.RunSpec`) first: every field's
        type, range and spelling, all problems of the file in one line; then the strategy's
        parameters. A config that passed these checks before is not checked again where the
        validated-input cache is on (`sim.core.inputcache`: the command line); what it names
        besides (a calibration file) always is."""
        seen = inputcache.Seen("run config", raw)
        if not seen.hit:
            from sim.core.schema import check

            check(run_spec(raw), raw, source)
        calibration = (raw.get("costs") or {}).get("calibration")
        if calibration:  # read as safely as the config itself, before the cost model does
            check_calibration_file(calibration)
        topo, nodes, model = raw["topology"], raw.get("nodes"), expand_preset(raw["model"])
        strat = raw.get("strategy") or {"name": "sequential"}
        if isinstance(strat, str):
            strat = {"name": strat}
        params = {k: v for k, v in strat.items() if k != "name"}
        if not seen.hit:
            from sim.config.run_core import check_params

            check_params(strat["name"], params, source)
            try:
                resolve_params(strat["name"], params)
            except ConfigError as e:
                raise ConfigError(f"{source}: {e}") from None
            seen.passed()
        passes = raw.get("passes") or ["fwd"]
        if isinstance(passes, str):
            passes = [passes]
        costs = dict(raw.get("costs") or {})
        if isinstance(costs.get("symmetry"), bool):  # YAML 1.1 reads a bare on/off as a bool
            costs["symmetry"] = "on" if costs["symmetry"] else "off"
        output = raw.get("output") or {}
        parallel = raw.get("parallel")
        fabric = raw.get("fabric") or {}
        limits = {k: v for k, v in (raw.get("limits") or {}).items() if v is not None}
        return cls(
            topo,
            nodes,
            dict(model),
            strat["name"],
            params,
            tuple(passes),
            dict(costs),
            dict(output),
            source,
            dict(fabric),
            None if parallel is None else dict(parallel),
            limits,
        )

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        """A run config from YAML, read safely (regular file, UTF-8, bounded aliases and
        nesting, no duplicate keys: `sim.core.safeload`)."""
        from sim.core.safeload import load_yaml

        return cls.from_dict(load_yaml(path, "config file"), source=str(path))

    @classmethod
    def demo(cls) -> RunConfig:
        text = resources.files("sim").joinpath("configs/demo.yaml").read_text()
        return cls.from_dict(yaml.safe_load(text), source="<embedded demo config>")

    def with_overrides(
        self,
        *,
        strategy: str | None = None,
        params: dict[str, Any] | None = None,
        topology: str | None = None,
        nodes: int | None = None,
        costs: dict[str, Any] | None = None,
        limits: dict[str, int] | None = None,
    ) -> RunConfig:
        raw = self.to_dict()
        if strategy is not None and strategy != self.strategy:
            raw["strategy"] = {"name": strategy}
        if params:
            raw["strategy"] = {**raw["strategy"], **params}
        if topology is not None:
            raw["topology"] = topology
        if nodes is not None:
            raw["nodes"] = nodes
        if costs:
            raw["costs"] = _merged(raw.get("costs", {}), costs)
        if limits:
            raw["limits"] = {**raw.get("limits", {}), **limits}
        return RunConfig.from_dict(raw, source=self.source)

    def with_strategy(self, name: str, params: dict[str, Any]) -> RunConfig:
        """This config with its strategy replaced by `name` and exactly `params`."""
        return RunConfig.from_dict(
            {**self.to_dict(), "strategy": {"name": name, **params}}, source=self.source
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "topology": self.topology,
            "model": dict(self.model),
            "strategy": {"name": self.strategy, **self.strategy_params},
            "passes": list(self.passes),
            "costs": dict(self.costs),
        }
        if self.nodes is not None:
            d["nodes"] = self.nodes
        if self.fabric:
            d["fabric"] = dict(self.fabric)
        if self.parallel is not None:
            d["parallel"] = dict(self.parallel)
        if self.output:
            d["output"] = dict(self.output)
        if self.limits:
            d["limits"] = dict(self.limits)
        return d

    def size_limits(self) -> Limits:
        """The limits in force for this config's runs: the defaults, with `limits:` raised."""
        return DEFAULT_LIMITS.merged(self.limits)

    # -- resolution ------------------------------------------------------------------------
    def load_topology(self) -> Topology:
        return Topology.load(self.topology, nodes=self.nodes, fabric=self.fabric)

    def layer(self, world: int) -> MoELayer:
        """The layer on `world` GPUs (fields checked by the schema on load; what depends on
        the world, experts over GPUs and the routing matrix's shape, by MoELayer)."""
        m = dict(self.model)
        m.pop("blocks", None)  # the model around the layers: `Workload.blocks`
        per_gpu = m.pop("experts_per_gpu", None)
        if per_gpu is not None:
            m["experts"] = per_gpu * world
        routing = m.pop("routing", None) or {"kind": "uniform"}
        if isinstance(routing, str):
            routing = {"kind": routing}
        # the [GPUs, experts] routing matrix is the largest array a layer allocates
        size_limits = limits.active()
        size_limits.check(
            "max_matrix",
            world * m["experts"],
            f"{self.source}: routing matrix entries ({world:,} GPUs x {m['experts']:,} experts)",
        )
        if routing.get("kind") == "matrix" and "file" in routing:
            routing = {"kind": "matrix", "tokens": load_matrix_file(routing["file"])}
        cf = float(m.pop("capacity_factor", 1.0))
        return MoELayer(world=world, routing=routing, capacity_factor=cf, **m)

    def workload(self, topo: Topology) -> Workload:
        """The layer of one data-parallel replica, the parallel layout over the topology's
        GPUs, and the strategy parameters the layout implies (TED's tp)."""
        return self.workload_for(topo.world_size, topo.gpus_per_node)

    def workload_for(self, W: int, G: int | None = None) -> Workload:
        """`workload` on W ranks with G per node (None: placement inside nodes unchecked,
        as for the executor's local processes)."""
        wl = self._workload_for(W, G)
        spec = self.model.get("blocks")
        if spec is not None:
            dp = 1 if wl.layout is None else wl.layout.dp
            blocks = BlockModel.from_spec(dict(spec), wl.layer.model_dim, dp)
            wl = Workload(wl.layer, wl.layout, wl.params, blocks)
        self._check_pairs(wl)
        # a strategy's chunks each hold a [GPUs, experts] slice of the routing matrix and
        # tasks on every rank: bound both before the builder allocates them
        degrees = [self.strategy_params.get("degree")]
        degrees += self.strategy_params.get("candidates") or []
        r = max((d for d in degrees if isinstance(d, int) and not isinstance(d, bool)), default=1)
        if r > 1:
            P, E = wl.layer.world, wl.layer.experts
            lim = limits.active()
            lim.check(
                "max_matrix",
                r * P * E,
                f"{self.source}: routing matrix entries of {r:,} chunks ({P:,} GPUs x {E:,} "
                "experts each)",
            )
            lim.check("max_tasks", r * P, f"{self.source}: tasks ({r:,} chunks on {P:,} ranks)")
        return wl

    def _check_pairs(self, wl: Workload) -> None:
        """Refuse, before the builder fills memory, a run whose memory for the P x P exchange
        of its group is over limits.max_pairs: P x P x what the strategy keeps per pair
        (`sim.strategies.pair_weight`: 1 for uniform exchanges, more for per-peer splits and
        derived fits), plus a derived all-to-all fit under costs.network: collective."""
        P = wl.layer.world
        w = pair_weight(self.strategy, wl.layer, wl.params, self.passes, wl.blocks)
        if self.costs.get("network") == "collective":
            w += DERIVED_FIT_WEIGHT
        what = f"{self.source}: all-to-all rank pairs x {self.strategy}'s memory per pair"
        limits.active().check("max_pairs", P * P * w, f"{what} ({P:,} x {P:,} GPUs x {w})")

    def _workload_for(self, W: int, G: int | None = None) -> Workload:
        params = dict(self.strategy_params)
        name = self.strategy
        strat = named(name)  # an unknown name is refused as from_dict does
        if strat.tp_overlay:  # Parm's placement: MP groups laid over the MoE ranks
            return self._parm_workload(W, G, params)
        if self.parallel is None:  # the old meaning: one EP group of the whole world
            layer = self.layer(W)
            tp = params.get("tp", strat.defaults["tp"]) if strat.layout_tp else 1
            tp = tp if isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1 else 1
            esp = layer.expert_shards
            if W % (tp * esp):  # TED's own check names the problem
                return Workload(layer, None, params)
            return Workload(layer, ParallelLayout(W // (tp * esp), 1, tp, esp), params)
        spec = dict(self.parallel)
        src = f"{self.source}: parallel"
        if strat.layout_tp:
            if "tp" in params and "tp" in spec and params["tp"] != spec["tp"]:
                raise ConfigError(
                    f"{src}.tp: {spec['tp']} disagrees with strategy.tp {params['tp']} "
                    "(give the TP size once, under parallel:)"
                )
            spec.setdefault("tp", params.get("tp", strat.defaults["tp"]))
        layout = from_spec(spec, W, G, source=src)
        if layout.pp > 1 or strat.stages_per_device is not None:
            params = _pipeline_params(name, params, layout, src)
        if strat.layout_tp:
            params["tp"] = layout.tp
        elif layout.tp > 1:
            raise ConfigError(
                f"{src}.tp: strategy {name!r} does not shard the MoE layer over tensor-parallel "
                f"ranks ({_which(lambda s: s.layout_tp, 'does')}); use tp: 1"
            )
        layer = self.layer(layout.mp)
        if layout.esp != layer.expert_shards:
            want = layout.mp // layout.esp
            raise ConfigError(
                f"{src}.esp: {layout.esp} GPUs per expert needs {want} experts in a replica of "
                f"{layout.mp} GPUs (model.experts: {want}), got {layer.experts}"
                if layout.esp > 1
                else f"{src}.esp: {layer.experts} experts over {layout.mp} GPUs slice each "
                f"expert over {layer.expert_shards} GPUs: give esp: {layer.expert_shards}"
            )
        return Workload(layer, layout, params)

    def _parm_workload(self, W: int, G: int | None, params: dict[str, Any]) -> Workload:
        """`parallel: {ep, esp, tp, dp}` with tp = N_MP laid over the ep x esp ranks
        (sim.workload.parallel); without `parallel:`, tp and esp from the strategy."""
        spec, src = dict(self.parallel or {}), f"{self.source}: parallel"
        for key in ("tp", "esp"):
            if key in params and key in spec and params[key] != spec[key]:
                raise ConfigError(
                    f"{src}.{key}: {spec[key]} disagrees with strategy.{key} {params[key]} "
                    f"(give the size once, under parallel:)"
                )
            spec.setdefault(key, params.get(key, 1))
        layout = from_spec(spec, W, G, source=src, tp_overlay=True)
        params |= {"tp": layout.tp, "esp": layout.esp}
        return Workload(self.layer(layout.mp), layout, params)


def _which(has: Any, verb: str) -> str:
    """The strategies with a property, as an error names them: "strategy 'ted' does"."""
    names = [s.name for s in STRATEGIES.values() if has(s)]
    if len(names) == 1:
        return f"strategy {names[0]!r} {verb}"
    return f"strategies {', '.join(map(repr, names))} {verb.replace('does', 'do')}"


def _pipeline_params(
    name: str, params: dict[str, Any], layout: ParallelLayout, src: str
) -> dict[str, Any]:
    """A pipeline strategy's stages from `parallel.pp` (its devices: DualPipe's pp stages
    on pp devices, DualPipeV's on pp/2), checked against `strategy.pp` when both are given."""
    per_device_of = STRATEGIES[name].stages_per_device
    if per_device_of is None:
        pipes = ", ".join(s.name for s in STRATEGIES.values() if s.stages_per_device is not None)
        raise ConfigError(
            f"{src}.pp: strategy {name!r} has no pipeline stages ({pipes} has); use pp: 1"
        )
    full = resolve_params(name, params)
    per_device = per_device_of(full)
    stages = layout.pp * per_device
    if stages < 2:
        raise ConfigError(
            f"{src}.pp: {full['variant']} needs at least 2 pipeline devices, got pp "
            f"{layout.pp} (give parallel.pp: the pipeline devices of a replica)"
        )
    if stages % 2:
        raise ConfigError(
            f"{src}.pp: dualpipe's two directions need an even number of pipeline devices, "
            f"got {layout.pp}"
        )
    if "pp" in params and params["pp"] != stages:
        raise ConfigError(
            f"{src}.pp: {layout.pp} pipeline devices run {stages} {full['variant']} stages, "
            f"but strategy.pp is {params['pp']} (give the pipeline once, under parallel:)"
        )
    return params | {"pp": stages}


@dataclass(frozen=True)
class Workload:
    """What a strategy builds from: one replica's layer, the layout, resolved parameters."""

    layer: MoELayer
    layout: ParallelLayout | None  # None only where the strategy's own check will refuse
    params: dict[str, Any]
    blocks: BlockModel | None = None  # `model.blocks`: the transformer around the layers


def _merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` applied; a dotted key (`resources.max_connections`, as `--cost`
    and `whatif --set` write it) sets one field of a nested mapping and keeps its others."""
    out = dict(base)
    for key, value in overrides.items():
        head, _, rest = str(key).partition(".")
        if rest:
            inner = out.get(head)
            out[head] = _merged(inner if isinstance(inner, dict) else {}, {rest: value})
        else:
            out[key] = value
    return out
