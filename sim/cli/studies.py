"""The `moesim replay` and `moesim whatif` subcommands: parsing and printing only."""

from __future__ import annotations

import argparse
import json
from typing import Any


def cmd_replay(a: argparse.Namespace) -> int:
    from sim.analysis.replay import format_replay, replay_command

    s = replay_command(a.trace, a.graph, a.topology, a.out)
    print(json.dumps(s, indent=2, default=str) if a.json else format_replay(s))
    return 0


def cmd_whatif(a: argparse.Namespace) -> int:
    from sim.analysis.whatif import format_whatif, whatif_command

    r = whatif_command(a.base, a.sets, a.topology, a.nodes, a.out)
    print(json.dumps(r, indent=2, default=str) if a.json else format_whatif(r))
    return 0


def add_parsers(sub: Any) -> None:
    """`moesim replay` and `moesim whatif` (sim.analysis.replay / whatif)."""
    rp = sub.add_parser(
        "replay",
        help="replay a measured trace (moesim CSV/Parquet, or PyTorch profiler JSON per rank)",
    )
    rp.add_argument(
        "trace",
        nargs="+",
        metavar="TRACE",
        help="moesim trace CSV/Parquet or executor output dir; or Kineto JSON(.gz), one per "
        "rank, or their directory",
    )
    rp.add_argument(
        "--graph",
        metavar="GRAPH.json",
        help="the task graph the executor ran (default: graph.json beside the trace, else "
        "inferred from stream order and collective matching)",
    )
    rp.add_argument(
        "--topology", help="topology to replay on (default localhost-cpu; only its size matters)"
    )
    rp.add_argument(
        "--out", metavar="DIR", help="write trace.csv, trace.chrome.json, graph.json, summary.json"
    )
    rp.add_argument("--json", action="store_true", help="print the summary as JSON")
    rp.set_defaults(fn=cmd_replay)

    w = sub.add_parser(
        "whatif", help="simulate a config, graph or measured trace before and after changes"
    )
    w.add_argument(
        "base",
        help="run config YAML, task graph JSON (needs --topology), or a measured trace (as for "
        "replay)",
    )
    w.add_argument(
        "--set",
        dest="sets",
        action="append",
        required=True,
        metavar="KEY=VALUE",
        help="repeatable: topology=T, nodes=N, link.<class>.bw=*2, link.*.latency=1e-6, "
        "compute.speed=*0.5 (a trace: its device work), host.speed=*2 (a trace's host ops), "
        "model.capacity_factor=1.5, model.routing.s=1.5, "
        "strategy=pipelined, strategy.degree=4, costs.network=flow",
    )
    w.add_argument("--topology", help="the cluster of a graph or trace base")
    w.add_argument("--nodes", type=int, help="node count of a graph base (default: just enough)")
    w.add_argument(
        "--out",
        metavar="DIR",
        help="write before/ and after/ (trace.csv, trace.chrome.json, summary.json), whatif.json",
    )
    w.add_argument("--json", action="store_true", help="print both summaries as JSON")
    w.set_defaults(fn=cmd_whatif)
