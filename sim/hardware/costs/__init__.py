"""Cost models: how long a task takes on given hardware, given what else is running.

`CostModel` bundles the three seams the engine asks: compute duration, collective-level
communication duration (when the run does not model flows), and interference. Every parameter
comes from the topology file or the run config's `costs:` section, never from code.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import Task
from sim.hardware.collectives import payload
from sim.hardware.costs.compute import AlphaBetaCompute, ComputeModel, RooflineCompute
from sim.hardware.costs.derived import collective_fit
from sim.hardware.costs.dispatch import Dispatch
from sim.hardware.costs.host import HostCompute, SharedCpu
from sim.hardware.costs.interference import Interference
from sim.hardware.costs.jitter import Jitter
from sim.hardware.costs.launch import HostLaunch
from sim.hardware.costs.measured import MeasuredCompute, measured
from sim.hardware.costs.network import CollectiveAlphaBeta
from sim.hardware.costs.resources import Resources
from sim.hardware.network.flows import FINISH_RTOL
from sim.hardware.topology import Topology

NETWORK_MODES = ("flow", "collective")
# what a collective's alpha-beta is when no fit was given: the flow model's own times
DERIVED = "derived from the flow model on this topology (sim.hardware.costs.derived)"
FIDELITIES = ("auto", "flow", "bundled")
SYMMETRY_MODES = ("auto", "on", "off")


@dataclass
class CostModel:
    """What each task costs: compute, network, interference and the rest."""

    compute: ComputeModel
    network: str  # "flow": per-message alpha + max-min shared links; "collective": alpha+beta*bytes
    collective: CollectiveAlphaBeta
    interference: Interference
    alpha: float  # per-message start-up in flow mode, seconds
    fidelity: str = "auto"
    bundle_min_ranks: int = 64  # `auto` bundles collectives of at least this many ranks
    dispatch: Dispatch = Dispatch()  # launch latency of ready tasks (sim.hardware.costs.dispatch)
    jitter: Jitter | None = None  # run-to-run noise (costs.jitter); None: the ideal run
    finish_rtol: float = FINISH_RTOL  # flows ending this close (x now) end together
    symmetry: str = "auto"  # simulate representatives of equivalent ranks (sim.engine.symmetric)
    resources: Resources = Resources()  # SMs, HBM, hardware queues (costs.resources)
    launch: HostLaunch = HostLaunch()  # host seconds per issued task (costs.launch)
    # where the compute model's parameters and the network mode came from (cost_sources)
    sources: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(cls, topo: Topology, spec: dict[str, Any] | None = None) -> CostModel:
        """Costs for `topo`, with the run config's `costs:` section layered on top (and under
        it, a calibration file named by `costs.calibration`)."""
        spec = dict(spec or {})
        given, cal_spec, cal_name = set(spec), {}, ""  # for `sources`: who gave each key
        cal_meta: dict[str, Any] | None = None
        if spec.get("calibration"):  # measured parameters under the config's explicit ones
            from sim.hardware.costs.calibration import Calibration
            from sim.hardware.costs.calibration_file import CalibrationWarning, foreign

            cal_name = str(spec["calibration"])
            cal = Calibration.load(spec.pop("calibration"))
            cal_meta = cal.meta
            other = foreign(cal.meta, str(topo.gpu.get("model", "")), topo.name)
            if other:
                warnings.warn(CalibrationWarning(other), stacklevel=2)
            cal_spec = cal.cost_spec()
            spec = {**cal_spec, **spec}
        spec.pop("calibration", None)

        def origin(key: str) -> str:
            """Who gave `costs.<key>`: the config (above a calibration), or the file."""
            if key in given:
                return "config"
            return f"calibration file {cal_name}" if key in cal_spec else "default"

        topo_src = f"topology {topo.name}"
        sources: dict[str, Any] = {"network": origin("network")}
        gpu = topo.gpu
        compute_kind = spec.pop("compute", "roofline")
        roof_src = f"roofline from {topo_src}'s gpu" + (
            f" with costs.roofline from the {origin('roofline')}" if "roofline" in spec else ""
        )
        roof = RooflineCompute.from_gpu(gpu, spec.pop("roofline", None))
        gpu_ab, spec_ab = gpu.get("alpha_beta") or {}, spec.get("alpha_beta") or {}
        ab = {**gpu_ab, **(spec.pop("alpha_beta", None) or {})}
        if compute_kind == "roofline":
            compute: ComputeModel = roof
            sources["compute"] = {"model": "roofline", "source": roof_src}
        elif compute_kind == "alpha_beta":
            fit_src = {k: f"{topo_src} (gpu.alpha_beta)" for k in gpu_ab}
            fit_src |= {k: origin("alpha_beta") for k in spec_ab}
            sources["compute"] = {
                "model": "alpha_beta",
                "fits": fit_src,
                "other_kinds": roof_src,
                **({"gemm_shapes": origin("gemm_shapes")} if spec.get("gemm_shapes") else {}),
            }
            compute = AlphaBetaCompute.from_params(
                ab, fallback=roof, shapes=spec.pop("gemm_shapes", None)
            )
        else:
            raise ConfigError(
                f"costs.compute: expected 'roofline' or 'alpha_beta', got {compute_kind!r}"
            )
        spec.pop("gemm_shapes", None)  # measured shapes refine alpha-beta; a roofline has none
        network = spec.pop("network", "flow")
        if network not in NETWORK_MODES:
            raise ConfigError(f"costs.network: expected one of {NETWORK_MODES}, got {network!r}")
        spec_fits = spec.pop("collectives", None) or {}
        fits = {**topo.collective_fits, **spec_fits}
        collective = CollectiveAlphaBeta.from_fits(fits)
        collective.sources = {k: f"{topo_src} (collectives)" for k in topo.collective_fits}
        collective.sources |= {k: origin("collectives") for k in spec_fits}
        # ranks sharing one CPU host (a CPU topology's shared_cpu): its cores, memory
        # bandwidth and gloo's all-to-all, against what the figures were measured under
        host = SharedCpu.build(topo, spec.pop("shared_cpu", None), cal_meta, bool(cal_name))
        plain = compute  # derived fits are the topology's own flow model, not host-scaled
        if host is not None:
            compute = HostCompute(compute, host)
            collective.adjust = host.collective_params
            sources["host"] = host.describe(network)
        inter = Interference.from_table(
            {**(gpu.get("interference") or {}), **(spec.pop("interference", None) or {})}
        )
        alpha = float(spec.pop("alpha", topo.alpha))
        # kinds without a measured fit: fitted to this cluster's flow model, as PipeMoE fits
        # its measurements (sim.hardware.costs.derived)
        collective.derive = partial(collective_fit, topo, alpha, plain)
        fidelity = spec.pop("fidelity", "auto")
        if fidelity not in FIDELITIES:
            raise ConfigError(f"costs.fidelity: expected one of {FIDELITIES}, got {fidelity!r}")
        min_ranks = spec.pop("bundle_min_ranks", 64)
        if not isinstance(min_ranks, int) or min_ranks < 1:
            raise ConfigError(
                f"costs.bundle_min_ranks: expected a positive integer, got {min_ranks!r}"
            )
        dispatch = Dispatch.from_spec(gpu.get("dispatch"), f"topology {topo.name}: gpu.dispatch")
        if spec.get("dispatch") is not None:
            dispatch = dispatch.overlay(spec.pop("dispatch"))
        spec.pop("dispatch", None)
        if host is not None:  # a hand-off is CPU work too: a woken thread waits for a core
            f = host.compute_factor
            dispatch = Dispatch(dispatch.stream * f, dispatch.cross * f)
        jitter = Jitter.from_spec(spec.pop("jitter", None))
        resources = Resources.build(gpu, spec.pop("resources", None))
        launch = HostLaunch.from_spec(spec.pop("launch", None), resources.launch_s)
        rtol = spec.pop("finish_rtol", FINISH_RTOL)
        if isinstance(rtol, bool) or not isinstance(rtol, (int, float)) or not 0 <= rtol <= 0.05:
            raise ConfigError(
                f"costs.finish_rtol: expected a relative time window in [0, 0.05], got {rtol!r}"
            )
        symmetry = spec.pop("symmetry", "auto")
        if symmetry not in SYMMETRY_MODES:
            raise ConfigError(f"costs.symmetry: expected one of {SYMMETRY_MODES}, got {symmetry!r}")
        if spec:
            raise ConfigError(f"costs: unknown field(s) {sorted(spec)}")
        model = cls(
            MeasuredCompute(compute),  # a replayed trace's tasks keep their measured times
            network,
            collective,
            inter,
            alpha,
            fidelity,
            min_ranks,
            dispatch,
            jitter,
            float(rtol),
            symmetry,
            resources,
            launch,
        )
        model.sources = sources
        return model

    def cost_sources(self) -> dict[str, Any]:
        """Where every fit this run used came from: the compute model's, and each collective
        kind's alpha-beta (given fits, and those derived from the flow model for kinds
        without one: `--network collective` then reproduces `flow` rather than checking it)."""
        c = self.collective
        coll: dict[str, Any] = {}
        for kind, rows in sorted(c.fits.items()):
            fits = [{"ranks": n, "alpha_s": a, "beta_s_per_byte": b} for n, a, b in rows]
            coll[kind] = {"source": c.sources.get(kind, "given"), "fits": fits}
        for (kind, ranks), (a, b) in sorted(c.derived.items()):
            entry = coll.setdefault(kind, {"source": DERIVED, "fits": []})
            entry["fits"].append({"ranks": ranks, "alpha_s": a, "beta_s_per_byte": b})
        return {
            "compute": dict(self.sources.get("compute", {})),
            "network": {"model": self.network, "source": self.sources.get("network", "default")},
            "collectives": coll,
        } | ({"host": dict(self.sources["host"])} if "host" in self.sources else {})

    # -- measured durations (trace replay, sim.hardware.costs.measured) -------------------
    def measured(self, task: Task) -> float | None:
        """A replayed task's measured time, which the engine takes over its own costs."""
        return measured(task)

    def comm_duration(self, task: Task, kind: str, ranks: int) -> float:
        """Collective-level time of one member: measured if replayed, else alpha-beta."""
        m = measured(task)
        return self.collective.duration(kind, ranks, payload(task)) if m is None else m
