"""One sweep point run to one results row, in whichever process runs it (a local worker or a
Dask worker): nothing here touches the output directory, the driver writes the row.

Any failure of the run (a ConfigError such as a layout that does not divide the world, a
size limit, a deadlock, or an exception of the simulator) becomes a row with status "error"
and the message on one line: one bad point never ends the sweep.
"""

from __future__ import annotations

import time
from typing import Any

from sim.analysis.sweep.spec import Point
from sim.core.errors import MoesimError

# The shared results row (helper `moesim report` reads it): these columns, then `param.<key>`
# per swept key. Floats are NaN and integers missing on an error row.
STR_COLUMNS = ("run_id", "config", "strategy", "status", "error", "chosen_params")
FLOAT_COLUMNS = (
    "makespan_s",
    "time_per_token_s",
    "exposed_comm_s",
    "exposed_comm_max_s",
    "comm_busy_s",
    "compute_busy_s",
    "peak_activation_bytes",
    # model states (weights, gradients, Adam states) beside the activations, and their sum,
    # counted alike for every strategy (sim.workload.accounting); NaN where unknown
    "model_state_bytes",
    "peak_memory_bytes",
    # of one MoE layer's (token, expert) choices, the share capacity dropped: rows that drop
    # more compute less, so their times are not for the same work
    "dropped_fraction",
    # the hottest GPU's kept rows over the mean (1: balanced): it paces the layer
    "gpu_load_max_mean",
    "wall_s",
)
INT_COLUMNS = ("tokens", "gpus", "tokens_routed", "tokens_kept", "tokens_dropped")
BOOL_COLUMNS = ("oom",)
COLUMNS = (
    STR_COLUMNS[:5]
    + ("makespan_s", "time_per_token_s")
    + INT_COLUMNS
    + FLOAT_COLUMNS[2:]
    + BOOL_COLUMNS
    + STR_COLUMNS[5:]
)


def run_point(point: Point) -> dict[str, Any]:
    """The results row of one point (without its `param.` columns: the driver adds them)."""
    row: dict[str, Any] = {
        "run_id": point.run_id,
        "config": point.config,
        "strategy": point.strategy,
        "status": "ok",
        "error": "",
    }
    t0 = time.perf_counter()
    try:
        summary, tokens = simulate_point(point)
    except MoesimError as e:
        return row | error_fields(str(e), time.perf_counter() - t0)
    except Exception as e:  # a bug of one run is that row's failure, not the sweep's
        return row | error_fields(f"{type(e).__name__}: {e}", time.perf_counter() - t0)
    busy = summary["busy_s"]
    chosen = {k: v for k, v in summary["params"].items() if k != "selector"}
    row |= {
        "makespan_s": float(summary["makespan_s"]),
        # what `moesim compare` ranks by: time per distinct token processed in the step
        "time_per_token_s": float(summary["makespan_s"]) / tokens,
        "tokens": int(tokens),
        "gpus": int(summary["world_size"]),
        "exposed_comm_s": float(summary["exposed_comm_s"]),
        "exposed_comm_max_s": float(summary["exposed_comm_max_s"]),
        "comm_busy_s": _busy(busy, "comm"),
        "compute_busy_s": _busy(busy, "compute"),
        "peak_activation_bytes": float(summary["peak_activation_bytes"]),
        "model_state_bytes": _float(summary.get("model_state_bytes")),
        "peak_memory_bytes": _float(summary.get("peak_memory_bytes")),
        **_tokens(summary.get("tokens_per_layer") or {}),
        "wall_s": time.perf_counter() - t0,
        "oom": bool(summary["oom"]),
        "chosen_params": ",".join(f"{k}={v}" for k, v in chosen.items()),
    }
    return row


def error_fields(message: str, wall_s: float = float("nan")) -> dict[str, Any]:
    nan = float("nan")
    return {
        "status": "error",
        "error": " ".join(message.split()) or "error",
        **{c: nan for c in FLOAT_COLUMNS},
        **{c: None for c in INT_COLUMNS + BOOL_COLUMNS},
        "wall_s": wall_s,
        "chosen_params": "",
    }


def _float(x: Any) -> float:
    """A number, or NaN for an unknown (null) one: the column stays float, the row says so."""
    return float("nan") if x is None else float(x)


def _tokens(t: dict[str, Any]) -> dict[str, Any]:
    """The summary's tokens of one MoE layer as row columns (None / NaN where unknown)."""
    out: dict[str, Any] = {f"tokens_{k}": t.get(k) for k in ("routed", "kept", "dropped")}
    return out | {
        "dropped_fraction": _float(t.get("dropped_fraction")),
        "gpu_load_max_mean": _float(t.get("gpu_load_max_mean")),
    }


def _busy(busy: dict[str, float], kind: str) -> float:
    """Busy time of a kind's streams (`comm`, `comm.1`, ...) summed: each is a mean over
    ranks already."""
    return float(sum(t for s, t in busy.items() if s.split(".")[0] == kind))


def simulate_point(point: Point) -> tuple[dict[str, Any], int]:
    """The summary of one point's run and the distinct tokens its step processes: the run
    `sim.run` makes (sim.pipeline.build_and_simulate), plus the link and
    compute-speed changes of `moesim whatif`."""
    from sim.analysis.compare import step_tokens
    from sim.analysis.whatif.study import with_links, with_speed
    from sim.config import RunConfig
    from sim.pipeline import build_and_simulate

    cfg = RunConfig.from_dict(point.raw, source=point.source)
    r = build_and_simulate(
        cfg,
        edit_topology=lambda topo: with_links(topo, list(point.links)),
        edit_costs=lambda costs: with_speed(costs, point.speed),
    )
    # counted as `moesim compare` counts them (micro-batches, MoE layers crossed, pipeline
    # devices, tensor-parallel replicas sharing their tokens)
    return r.summary, step_tokens(r.workload.layer, r.result.graph)
