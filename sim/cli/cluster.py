"""`moesim topology` and `moesim collectives`: the cluster itself, without a workload."""

from __future__ import annotations

import argparse
from typing import Any

from sim.cli.options import limit_opt, limits, refuse
from sim.core.errors import ConfigError
from sim.core.io import check_output_file


def _size(text: str) -> int:
    """1024, 1K, 16M, 1G (binary multiples, as nccl-tests' -b/-e take them)."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    t = text.strip().upper().removesuffix("B")
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except (ValueError, OverflowError):  # OverflowError: infK, 1e400 (no integer size)
        raise argparse.ArgumentTypeError(
            f"size {text!r}: expected e.g. 1024, 64K, 16M, 1G"
        ) from None


def cmd_collectives(a: argparse.Namespace) -> int:
    from sim import commands

    if a.out is not None:
        check_output_file(a.out, "--out")
    sweep = commands.collective_sweep(
        a.topology,
        a.collective,
        a.algo,
        a.min,
        a.max,
        a.factor,
        nodes=a.nodes,
        fidelity=a.fidelity,
        oversubscription=a.oversubscription,
        limits=limits(a),
    )
    text = sweep.report(as_json=a.json)
    print(text)
    if a.out:
        commands.write_text(a.out, text)
    return 0


def cmd_topology(a: argparse.Namespace) -> int:
    from sim import commands

    if a.action == "list":
        refuse(
            a,
            {
                "name": "a NAME",
                "nodes": "--nodes",
                "routes": "--routes",
                "draw": "--draw",
                "limit": "--limit",
            },
            "to `topology list` (they apply to `topology show NAME`)",
        )
        for name in commands.topology_presets():
            print(name)
        return 0
    if not a.name:
        raise ConfigError("topology show: name a preset or a YAML file")
    if a.draw is not None:
        check_output_file(a.draw, "--draw")
    topo = commands.load_topology(a.name, nodes=a.nodes, limits=limits(a))
    print(commands.describe_topology(topo))
    if a.draw:
        print(f"  drew {commands.draw_topology(topo, a.draw)}")
    if a.routes:
        print("  routes from gpu0:")
        for dst, links in commands.routes_from_gpu0(topo):
            print(f"    rank 0 -> {dst}: " + " ".join(links))
    return 0


def add_parsers(sub: Any) -> None:
    """`moesim topology` and `moesim collectives`."""
    t = sub.add_parser("topology", help="list presets or show one")
    t.add_argument("action", choices=["list", "show"])
    t.add_argument("name", nargs="?")
    t.add_argument("--nodes", type=int)
    t.add_argument("--routes", action="store_true", help="also print routes from GPU 0")
    t.add_argument("--draw", metavar="FILE.html", help="draw the cluster graph (plotly HTML)")
    limit_opt(t)
    t.set_defaults(fn=cmd_topology)

    c = sub.add_parser("collectives", help="nccl-tests-style sweep of one collective, simulated")
    c.add_argument("--topology", default="dgx-a100", help="preset or YAML (default dgx-a100)")
    c.add_argument("--nodes", type=int, help="node count (default: the preset's)")
    c.add_argument(
        "--collective",
        "-c",
        default="all_to_all",
        choices=[
            "all_to_all",
            "all_gather",
            "reduce_scatter",
            "all_reduce",
            "broadcast",
            "sendrecv",
        ],
    )
    c.add_argument(
        "--algo",
        help="algorithm, e.g. linear, pairwise, 2dh, rail_relay, ring, "
        "hierarchical (default: the kind's default)",
    )
    c.add_argument("--min", "-b", type=_size, default=_size("1K"), help="smallest size (1K)")
    c.add_argument("--max", "-e", type=_size, default=_size("1G"), help="largest size (1G)")
    c.add_argument("--factor", "-f", type=int, default=2, help="size step factor (2)")
    c.add_argument("--fidelity", choices=["auto", "flow", "bundled"])
    c.add_argument("--oversubscription", type=float, help="override the fabric's ratio")
    c.add_argument("--json", action="store_true", help="print JSON instead of the table")
    c.add_argument("--out", help="also write the output to this file")
    limit_opt(c)
    c.set_defaults(fn=cmd_collectives)
