"""Cost models: how long a task takes on given hardware, given what else is running.

`CostModel` bundles the three seams the engine asks: compute duration, collective-level
communication duration (when the run does not model flows), and interference. Every parameter
comes from the topology file or the run config's `costs:` section, never from code.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import partial
from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import Task
from sim.hardware.collectives import payload
from sim.hardware.costs.compute import AlphaBetaCompute, ComputeModel, RooflineCompute
from sim.hardware.costs.derived import collective_fit
from sim.hardware.costs.dispatch import Dispatch
from sim.hardware.costs.interference import Interference
from sim.hardware.costs.jitter import Jitter
from sim.hardware.costs.measured import MeasuredCompute, measured
from sim.hardware.costs.network import CollectiveAlphaBeta
from sim.hardware.costs.resources import Resources
from sim.hardware.network.flows import FINISH_RTOL
from sim.hardware.topology import Topology

NETWORK_MODES = ("flow", "collective")
FIDELITIES = ("auto", "flow", "bundled")
SYMMETRY_MODES = ("auto", "on", "off")


@dataclass
class CostModel:
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

    @classmethod
    def build(cls, topo: Topology, spec: dict[str, Any] | None = None) -> CostModel:
        """Costs for `topo`, with the run config's `costs:` section layered on top (and under
        it, a calibration file named by `costs.calibration`)."""
        spec = dict(spec or {})
        if spec.get("calibration"):  # measured parameters under the config's explicit ones
            from sim.hardware.costs.calibration import Calibration
            from sim.hardware.costs.calibration_file import CalibrationWarning, foreign

            cal = Calibration.load(spec.pop("calibration"))
            other = foreign(cal.meta, str(topo.gpu.get("model", "")), topo.name)
            if other:
                warnings.warn(CalibrationWarning(other), stacklevel=2)
            spec = {**cal.cost_spec(), **spec}
        spec.pop("calibration", None)
        gpu = topo.gpu
        compute_kind = spec.pop("compute", "roofline")
        roof = RooflineCompute.from_gpu(gpu, spec.pop("roofline", None))
        ab = {**(gpu.get("alpha_beta") or {}), **(spec.pop("alpha_beta", None) or {})}
        if compute_kind == "roofline":
            compute: ComputeModel = roof
        elif compute_kind == "alpha_beta":
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
        fits = {**topo.collective_fits, **(spec.pop("collectives", None) or {})}
        collective = CollectiveAlphaBeta.from_fits(fits)
        inter = Interference.from_table(
            {**(gpu.get("interference") or {}), **(spec.pop("interference", None) or {})}
        )
        alpha = float(spec.pop("alpha", topo.alpha))
        # kinds without a measured fit: fitted to this cluster's flow model, as PipeMoE fits
        # its measurements (sim.hardware.costs.derived)
        collective.derive = partial(collective_fit, topo, alpha, compute)
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
        jitter = Jitter.from_spec(spec.pop("jitter", None))
        resources = Resources.build(gpu, spec.pop("resources", None))
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
        return cls(
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
        )

    # -- measured durations (trace replay, sim.hardware.costs.measured) -------------------
    def measured(self, task: Task) -> float | None:
        """A replayed task's measured time, which the engine takes over its own costs."""
        return measured(task)

    def comm_duration(self, task: Task, kind: str, ranks: int) -> float:
        """Collective-level time of one member: measured if replayed, else alpha-beta."""
        m = measured(task)
        return self.collective.duration(kind, ranks, payload(task)) if m is None else m
