"""The timelines of a plan's top candidates (`sim.training.plan`), for its HTML page
(`sim.training.plan_report`): each candidate's step simulated again as `moesim predict`
simulates it (`sim.training.step.run_step`: the stages' passes in the pipeline's schedule,
its collectives timed on the topology), its tasks read back per stage and stream.

The step's graph is the one `run_step` simulates (`StepModel.graph`); each timeline carries
the step it simulated beside the plan's, and the page says so where they differ (a
collective the plan's workers timed otherwise, for one).

A page stays light whatever the step: at most STAGES_SHOWN stages per candidate (the first,
the last and some between: a stage's passes repeat on the others, shifted), and on each lane
the tasks of one kind closer than 1/RESOLUTION of the step merged into one bar.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.training.plan_space import Candidate, Request, base_recipe, candidate_row, recipe_of

TOP = 3  # candidates drawn
STAGES_SHOWN = 4
RESOLUTION = 1500  # bars per lane and kind, at most about
# the lanes of a stage: the engine's streams of `sim.training.pipeline.step_graph`
LANES = {"compute": "compute", "comm.ep": "EP comm", "comm.dp": "DP comm"}
P2P = "PP send"
COLOURS = {
    "forward": "#4c78a8",
    "backward": "#f58518",
    "optimizer": "#54a24b",
    "EP all-to-all": "#e45756",
    "DP gather / reduce": "#b279a2",
    "PP send": "#9d755d",
}


@dataclass
class Timeline:
    label: str  # the candidate
    step_s: float  # the step this simulation took
    predicted_s: float  # the plan's prediction of it (they agree unless run_step changed)
    bars: list[tuple[int, str, str, float, float]]  # (stage, lane, kind, start, end)


def timelines(req: Request, ranked: list[tuple[Candidate, float]], known: dict) -> list[Timeline]:
    """The timelines of `ranked` ((candidate, predicted step) each, best first); `known`:
    the collectives the workers simulated, by layout, so that the main process does not
    simulate them again."""
    from sim.training.predict import MODELS, _lookup, parse_row, prepare
    from sim.workload.architectures import architecture

    arch = architecture(_lookup(MODELS, req.model, "model", req.where))
    base = base_recipe(req)
    out = []
    for c, predicted in ranked:
        run = parse_row({k: str(v) for k, v in candidate_row(req, c).items()}, 1)
        p = prepare(run, recipe_of(base, c, arch.mla is not None))
        shared = p.comm.shared()
        for k, v in known.get(p.comm.layout_key()[1], {}).items():
            shared.setdefault(k, v)
        step_s, bars = _simulate(p)
        out.append(Timeline(c.label(), step_s, predicted, bars))
    return out


def _simulate(p: Any) -> tuple[float, list[tuple[int, str, str, float, float]]]:
    """The step of a prepared run as `run_step` simulates it: (makespan, merged bars)."""
    from sim.engine.engine import simulate
    from sim.training.step import StepModel

    lay = p.layout
    model = StepModel(p.arch, lay, p.precision, p.recipe, p.gpu, p.comm, p.imbalance).on(p.topo)
    progs, _ = model.stage_programs()
    g, ranks, _ = model.graph(progs, p.topo)
    res = simulate(g, p.topo, p.costs)
    shown = _shown(lay.pp)
    stage_of = {r: s for s, r in enumerate(ranks) if s in shown}
    raw: dict[tuple[int, str, str], list[tuple[float, float]]] = {}
    for t, a, b in zip(g.tasks.values(), res.start, res.end):
        s = stage_of.get(t.rank)
        # a recv is posted long before its data comes: its send is the transfer drawn
        if s is None or b <= a or t.kind == "recv":
            continue
        lane, kind = _lane(t)
        raw.setdefault((s, lane, kind), []).append((float(a), float(b)))
    gap = res.makespan / RESOLUTION
    bars = [
        (s, lane, kind, a, b)
        for (s, lane, kind), spans in raw.items()
        for a, b in _merged(sorted(spans), gap)
    ]
    return res.makespan, bars


def _shown(pp: int) -> set[int]:
    """The stages drawn: the first, the last and evenly spaced ones between."""
    n = min(pp, STAGES_SHOWN)
    return {round(i * (pp - 1) / (n - 1)) for i in range(n)} if n > 1 else {0}


def _lane(t: Any) -> tuple[str, str]:
    """(lane, kind) of a step task."""
    if t.stream == "compute":
        phase = t.tags.get("phase", "")
        return "compute", {"fwd": "forward", "bwd": "backward"}.get(phase, "optimizer")
    if t.stream == "comm.ep":
        return LANES[t.stream], "EP all-to-all"
    if t.stream == "comm.dp":
        return LANES[t.stream], "DP gather / reduce"
    return P2P, "PP send"


def _merged(spans: list[tuple[float, float]], gap: float) -> list[tuple[float, float]]:
    """Sorted spans with those closer than `gap` joined."""
    out: list[tuple[float, float]] = []
    for a, b in spans:
        if out and a - out[-1][1] <= gap:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def figure(lines: list[Timeline]) -> Any:
    """The timelines one above the other on one time axis (seconds into the step), a lane
    per stage and stream, bars coloured by what runs."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=len(lines),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=[
            f"#{i}: {t.label}: step {t.step_s:.3f} s" for i, t in enumerate(lines, start=1)
        ],
    )
    legend: set[str] = set()
    for row, t in enumerate(lines, start=1):
        order = [
            f"stage {s} {lane}"
            for s in sorted({b[0] for b in t.bars})
            for lane in (*LANES.values(), P2P)
            if any(b[0] == s and b[1] == lane for b in t.bars)
        ]
        for kind, colour in COLOURS.items():
            mine = [b for b in t.bars if b[2] == kind]
            if not mine:
                continue
            fig.add_trace(
                go.Bar(
                    orientation="h",
                    base=[b[3] for b in mine],
                    x=[b[4] - b[3] for b in mine],
                    y=[f"stage {b[0]} {b[1]}" for b in mine],
                    marker={"color": colour, "line": {"width": 0}},
                    name=kind,
                    legendgroup=kind,
                    showlegend=kind not in legend,
                    hovertemplate="%{y}: %{base:.4f} s + %{x:.4f} s<extra>" + kind + "</extra>",
                ),
                row=row,
                col=1,
            )
            legend.add(kind)
        fig.update_yaxes(
            title_text="stage, stream",
            categoryorder="array",
            categoryarray=order[::-1],
            row=row,
            col=1,
        )
        fig.update_xaxes(title_text="time into the step, s", row=row, col=1)
    fig.update_layout(
        barmode="overlay",
        bargap=0.2,
        height=max(400, 60 + sum(180 + 22 * len({(b[0], b[1]) for b in t.bars}) for t in lines)),
        title="The top candidates' steps, simulated again (one time axis)",
    )
    return fig
