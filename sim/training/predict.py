"""`moesim predict TABLE.csv`: every row of a table of training runs (the columns of
Megatron-Bridge's performance summary) predicted from the model, the hardware and the layout.

A row is parsed into a run (`Run`), simulated (`sim.training.step`), and returned as its input
columns plus the predictions. Its recipe is the recorded one (`sim.training.recipe`), with the
optional CHOICES columns over it where not empty (`moesim plan` writes its best candidate
so). A row that cannot be built keeps its columns and gets a `reason` (one line naming the
row and the field), never a traceback. Where the table has a measured
`tokens_per_s_per_gpu` the row gets its signed relative `error`, and the result the MAPE per
system and overall.
"""

from __future__ import annotations

import csv
import functools
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError, MoesimError
from sim.training.layout import Layout
from sim.training.pipeline_kind import check_pipeline
from sim.training.precision import PRECISIONS
from sim.training.recipe import Recipe, bridge_queues, recipe_for
from sim.training.row_cells import imbalance_cell, int_cell, parse_choices, with_choices
from sim.training.step_costs import costs, step_costs

# The table's names -> presets (topologies/ and sim/workload/architectures.yaml)
SYSTEMS = {"DGX-H100": "dgx-h100", "DGX-B200": "dgx-b200", "DGX-GB200": "gb200-nvl72"}
# GPUs a job takes of each node: DGX-GB200 jobs use 64 of an NVL72 rack's 72 GPUs (16 of its 18
# compute trays): the HybridEP recipes set NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=64 with
# NVLINK_DOMAIN_SIZE=72 (Megatron-Bridge v0.3.0, scripts/performance/perf_plugins.py, DeepSeek-V3
# GB200), and every GB200 row's GPU count is a multiple of 64 or fits in one rack.
GPUS_PER_DOMAIN = {"DGX-GB200": 64}
MODELS = {
    "DeepSeekV3": "deepseek-v3",
    "Qwen3_30B_A3B": "qwen3-30b-a3b",
    "Qwen3_235B_A22B": "qwen3-235b-a22b",
    "GPT_OSS_120B": "gpt-oss-120b",
    "LLAMA3_8B": "llama3-8b",
    "LLAMA3_70B": "llama3-70b",
    "LLAMA3.1_405B": "llama3.1-405b",
}
REQUIRED = (
    "system",
    "model",
    "gpus",
    "precision",
    "gbs",
    "mbs",
    "seq_len",
    "fsdp",
    "tp",
    "pp",
    "cp",
    "vp",
    "ep",
    "ga",
)
MEASURED = "tokens_per_s_per_gpu"
OUTPUT_FIELDS = (
    "predicted_step_s",
    "predicted_tokens_per_s_per_gpu",
    "predicted_tflops_per_gpu",
    "peak_memory_bytes",
    "memory_margin_bytes",
    "error",
    "reason",
)


@dataclass
class Run:
    """One row, parsed."""

    row: int
    system: str
    model: str
    precision: str
    layout: Layout
    variant: str = ""
    columns: dict[str, Any] = field(default_factory=dict)
    imbalance: float = 1.0  # `routing_max_mean`: the hottest EP rank's rows over the mean
    choices: dict[str, Any] = field(default_factory=dict)  # CHOICES given, parsed

    @property
    def where(self) -> str:
        return (
            f"row {self.row} ({self.system} {self.model} {self.precision}, {self.layout.gpus} GPUs)"
        )


def _lookup(table: dict[str, str], value: str, what: str, where: str) -> str:
    if value in table:
        return table[value]
    if value in table.values():
        return value
    raise ConfigError(f"{where}: {what}: unknown {what} {value!r} (known: {', '.join(table)})")


def parse_row(cols: dict[str, Any], row: int) -> Run:
    where = f"row {row}"
    missing = [k for k in REQUIRED if k not in cols]
    if missing:
        raise ConfigError(f"{where}: missing column(s) {', '.join(missing)}")
    system = str(cols["system"]).strip()
    model = str(cols["model"]).strip()
    where = f"row {row} ({system} {model})"
    _lookup(SYSTEMS, system, "system", where)
    _lookup(MODELS, model, "model", where)
    precision = str(cols["precision"]).strip().upper()
    if precision not in PRECISIONS:
        raise ConfigError(
            f"{where}: precision: unknown {precision!r} (known: {', '.join(PRECISIONS)})"
        )
    fsdp = int_cell(cols, "fsdp", where, default=0, low=0)
    lay = Layout(
        gpus=int_cell(cols, "gpus", where),
        tp=int_cell(cols, "tp", where, 1),
        pp=int_cell(cols, "pp", where, 1),
        cp=int_cell(cols, "cp", where, 1),
        vp=int_cell(cols, "vp", where, 1),
        ep=int_cell(cols, "ep", where, 1),
        fsdp=fsdp,
        mbs=int_cell(cols, "mbs", where),
        gbs=int_cell(cols, "gbs", where),
        seq=int_cell(cols, "seq_len", where),
        where=where,
    )
    ga = int_cell(cols, "ga", where, default=0, low=0)
    if ga and ga != lay.ga:
        raise ConfigError(
            f"{where}: ga: {ga} but gbs / (mbs x dp) = {lay.gbs} / ({lay.mbs} x {lay.dp}) "
            f"= {lay.ga}"
        )
    return Run(
        row,
        system,
        model,
        precision,
        lay,
        str(cols.get("variant") or "").strip(),
        dict(cols),
        imbalance_cell(cols, where),
        parse_choices(cols, where),
    )


def read_table(path: str | Path) -> list[dict[str, Any]]:
    from sim.core.safeload import read_text

    text = read_text(Path(path), "table")
    rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        raise ConfigError(f"{path}: no rows (expected a CSV header and at least one row)")
    missing = [k for k in REQUIRED if k not in rows[0]]
    if missing:
        raise ConfigError(f"{path}: missing column(s) {', '.join(missing)}")
    return rows


@dataclass
class Prepared:
    """A run made ready to simulate: its model, layout, precision, recipe, GPU kernels,
    collective timer, topology and the pipeline's cost model."""

    arch: Any
    layout: Layout
    precision: Any
    recipe: Recipe
    gpu: Any
    comm: Any
    topo: Any
    costs: Any
    imbalance: float = 1.0


def load_kernels(spec: str) -> tuple[str, dict[str, Any]]:
    """`SYSTEM=FILE`: measured `gpu.kernels` figures (a GPU suite's proposed_kernels.yaml, or
    any YAML with a `kernels:` mapping) that replace the preset's for that system's rows."""
    from sim.core.safeload import load_yaml
    from sim.hardware.topology.schema import KernelParams

    if "=" not in spec:
        raise ConfigError(f"--kernels {spec!r}: expected SYSTEM=FILE, e.g. DGX-H100=kernels.yaml")
    system, path = spec.split("=", 1)
    _lookup(SYSTEMS, system, "system", "--kernels")
    raw = load_yaml(path, "kernels file")
    if not isinstance(raw, dict) or not isinstance(raw.get("kernels"), dict):
        raise ConfigError(f"{path}: expected a mapping with a `kernels:` mapping of gpu.kernels")
    try:
        KernelParams.model_validate(raw["kernels"])
    except Exception as e:  # pydantic's ValidationError: its first problem, on one line
        first = str(e).splitlines()
        raise ConfigError(f"{path}: kernels: {' '.join(first[1:3]) or first[0]}") from None
    return system, dict(raw["kernels"])


KERNELS: dict[str, dict[str, Any]] = {}  # measured gpu.kernels per system (--kernels)


def prepare(run: Run, recipe: Recipe | None = None) -> Prepared:
    """Everything a run's step needs, checked (one-line errors naming the row)."""
    from sim.training.comm import CommTimer
    from sim.training.kernels import GpuKernels
    from sim.training.precision import precision_of
    from sim.workload.architectures import architecture

    arch = architecture(_lookup(MODELS, run.model, "model", run.where))
    arch = shortened(arch, run.choices.get("num_layers"), run.where)
    recipe = recipe or recipe_for(
        run.model, run.system, run.precision, str(run.columns.get("release", "")).strip()
    )
    recipe = with_choices(recipe, run.choices, arch.mla is not None)
    if "w/o mtp" in run.variant.lower():
        arch = replace(arch, mtp=0)
    elif recipe.mtp is not None:
        arch = replace(arch, mtp=recipe.mtp)
    lay = run.layout
    if arch.moe and arch.experts % lay.ep:
        raise ConfigError(f"{run.where}: ep: {lay.ep} does not divide the {arch.experts} experts")
    if not arch.moe and lay.ep > 1:
        raise ConfigError(f"{run.where}: ep: {lay.ep} for the dense model {run.model}")
    if run.imbalance != 1.0 and not (arch.moe and run.imbalance <= lay.ep):
        bound = f"at most ep = {lay.ep} (all on one rank)" if arch.moe else "1 (a dense model)"
        raise ConfigError(f"{run.where}: routing_max_mean: {run.imbalance:g}, expected {bound}")
    if recipe.etp != lay.etp:
        lay = replace(lay, etp=recipe.etp)  # checked again by Layout
    check_pipeline(recipe.pipeline, lay.pp, lay.vp, lay.ga, run.where, lay.fsdp, arch.layers)
    preset = _lookup(SYSTEMS, run.system, "system", run.where)
    probe = _topology(preset, 1)
    spec = probe.gpu
    measured = KERNELS.get(run.system) or KERNELS.get(preset)
    if measured:  # measured figures over the preset's, field by field
        spec = {**spec, "kernels": {**(spec.get("kernels") or {}), **measured}}
    gpu = GpuKernels.from_gpu(spec, f"{run.where}: {preset}")
    prec = precision_of(run.precision, recipe)
    gpu.rate(prec.gemm)  # refuses a precision the GPU has no GEMMs for, with the row named
    per_domain = GPUS_PER_DOMAIN.get(run.system)
    nodes = math.ceil(lay.gpus / (per_domain or probe.gpus_per_node))
    topo = _topology(preset, nodes)
    comm = CommTimer(topo, costs(topo, "flow"), lay, per_domain)
    if recipe.max_connections is None:  # as the performance scripts set them for the run
        major = int((spec.get("compute_capability") or [9])[0])
        queues = bridge_queues(major, lay.tp, lay.cp, recipe.ep_overlap, recipe.dispatcher)
        recipe = replace(recipe, max_connections=queues)
    step = step_costs(topo, recipe.max_connections)
    return Prepared(arch, lay, prec, recipe, gpu, comm, topo, step, run.imbalance)


def shortened(arch: Any, layers: int | None, where: str) -> Any:
    """`arch` with `layers` transformer layers (None: as it is), its first dense layers kept
    (Megatron-Core's proxies of DeepSeek-V3: `--num-layers 14 --moe-layer-freq
    ([0]*3+[1]*11)`); a MoE model keeps at least one MoE layer."""
    if layers is None or layers == arch.layers:
        return arch
    if arch.moe and layers <= arch.first_dense:
        raise ConfigError(
            f"{where}: num_layers: {layers} leaves no MoE layer after the model's "
            f"{arch.first_dense} dense ones (expected more than {arch.first_dense})"
        )
    return replace(arch, layers=layers)


@functools.lru_cache(maxsize=16)
def _topology(preset: str, nodes: int) -> Any:
    """A preset's topology of `nodes` nodes, built once per process (read only after)."""
    from sim.hardware.topology import Topology

    return Topology.load(preset, nodes=nodes)


def predict_run(
    run: Run, recipe: Recipe | None = None, sensitivity: bool = False
) -> dict[str, Any]:
    """Simulate one run; the prediction fields of its output row. `sensitivity`: also the
    step's sensitivity to the GPU, the host and the links (`sim.training.sensitivity`: three
    more steps simulated)."""
    from sim.training.step import run_step

    p = prepare(run, recipe)
    t0 = time.process_time()
    res = run_step(
        p.arch, p.layout, p.precision, p.recipe, p.gpu, p.comm, p.topo, p.costs, p.imbalance
    )
    cpu_s = time.process_time() - t0  # the step's own, without the sensitivities' steps
    extra: dict[str, Any] = {}
    if sensitivity:
        from sim.training.sensitivity import bound_by, sensitivities

        sens = sensitivities(p, res.step_s)
        extra = {"sensitivity": sens, "bound_by": bound_by(sens)}
    return {
        "predicted_step_s": res.step_s,
        "predicted_tokens_per_s_per_gpu": res.tokens_per_s_per_gpu,
        "predicted_tflops_per_gpu": res.tflops_per_gpu,
        "peak_memory_bytes": res.memory.peak_bytes,
        "memory_margin_bytes": res.memory.margin_bytes,
        "memory_parts": res.memory.parts,
        "breakdown": res.breakdown,
        "recipe": p.recipe.source,
        **extra,
        "cpu_s": cpu_s,
        **res.meta,
    }


def as_ran(rec: dict[str, Any]) -> dict[str, Any]:
    """A row's columns at the layout its release's recipe ran, where recipes.yaml records
    that the printed one cannot be what ran (`recipe.layout_ran`): those fields replaced, GA
    left to the batch, and `layout_ran` / `layout_why` saying so; else the row as printed."""
    from sim.training.recipe import layout_ran

    key = [str(rec.get(k) or "").strip() for k in ("model", "system", "precision", "release")]
    ran, why = layout_ran(key[0], key[1], key[2].upper(), key[3])
    if not ran:
        return rec
    printed = {k: str(rec.get(k) or "").strip() for k in ran}
    return {
        **rec,
        **{k: str(v) for k, v in ran.items()},
        "ga": "",
        "layout_ran": ", ".join(f"{k} {printed[k] or '-'} -> {v}" for k, v in ran.items()),
        "layout_why": why,
    }


def predict_one(item: tuple[int, dict[str, Any], bool, bool]) -> dict[str, Any]:
    """One row (its 1-based number, its columns, whether to add the step's sensitivities,
    whether to take its layout as printed): its columns plus the predictions and the error,
    or its reason. Unless `as_printed`, a row whose printed layout cannot be what ran is
    predicted at its recipe's (`as_ran`); its output keeps the printed columns."""
    i, cols, sensitivity, as_printed = item
    rec: dict[str, Any] = {k: v for k, v in cols.items() if k != "_row"}
    try:
        ran = rec if as_printed else as_ran(rec)
        rec.update({k: ran[k] for k in ("layout_ran", "layout_why") if k in ran})
        run = parse_row(ran, int(cols.get("_row", i)))
        rec.update(predict_run(run, sensitivity=sensitivity))
        measured = _measured(cols.get(MEASURED))
        if measured:
            rec["error"] = rec["predicted_tokens_per_s_per_gpu"] / measured - 1.0
    except MoesimError as e:
        rec["reason"] = str(e)
    return rec


def predict_rows(
    rows: list[dict[str, Any]],
    progress: Any = None,
    workers: int = 1,
    kernels: dict[str, dict[str, Any]] | None = None,
    sensitivity: bool = False,
    as_printed: bool = False,
) -> dict[str, Any]:
    """Every row predicted (or given its reason), on `workers` local processes; the MAPE per
    system and overall where measured. Rows keep their order. `kernels`: measured
    `gpu.kernels` per system (`load_kernels`), over the presets'. `sensitivity`: each row's
    sensitivity to the GPU, the host and the links too (`sim.training.sensitivity`).
    `as_printed`: every row at its printed layout (else at its recipe's where that one ran)."""
    KERNELS.clear()
    KERNELS.update(kernels or {})
    items = [(i, r, sensitivity, as_printed) for i, r in enumerate(rows, start=1)]
    out: list[dict[str, Any]] = []
    if workers > 1 and len(items) > 1:
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(
            min(workers, len(items)), initializer=KERNELS.update, initargs=(kernels or {},)
        )
        with pool:
            for rec in pool.map(predict_one, items):
                out.append(rec)
                if progress is not None:
                    progress(len(out), len(rows))
    else:
        for item in items:
            out.append(predict_one(item))
            if progress is not None:
                progress(len(out), len(rows))
    return {"rows": out, "mape": mape(out)}


def _measured(raw: Any) -> float | None:
    try:
        v = float(str(raw).replace(",", ""))
    except (TypeError, ValueError):
        return None
    return v if v > 0 and math.isfinite(v) else None


def mape(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean absolute relative error of tokens/s/GPU, overall and per system, with the count
    and the worst row."""
    by: dict[str, list[float]] = {}
    for r in rows:
        if r.get("error") is None:
            continue
        by.setdefault("overall", []).append(abs(r["error"]))
        by.setdefault(str(r.get("system")), []).append(abs(r["error"]))
    return {k: {"mape": sum(v) / len(v), "worst": max(v), "rows": len(v)} for k, v in by.items()}
