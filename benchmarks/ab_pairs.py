"""Measured A/B pairs predicted (issues 23 and 24): the same run measured twice with one
choice changed, all else equal (`benchmarks/heldout/ab_pairs.csv`, each row with its source:
the pull requests that measured them). None of them is in the table `gpu.kernels.launch_s`
is fitted to. What they check is the change's gain, the ratio of the two runs' throughputs,
which a constant error of the step model cancels out of:
- Megatron-Core's EP overlap off and on (Qwen3-30B on 16 H100, NCCL's all-to-all and
  HybridEP; a 14-layer DeepSeek-V3 on 64 H100 under full recomputation): the merged forward /
  backward pairs, the dispatcher's kernels holding SMs while they run
  (`sim.training.contention.ep_hold`), the communication hidden;
- full recomputation off and on (the same DeepSeek-V3): the replayed forward, its
  collectives included (`sim.training.layer_phases`);
- the GPU's hardware queues, 1 and 32 (CUDA_DEVICE_MAX_CONNECTIONS; the same DeepSeek-V3
  with EP overlap, which was also measured at one queue): the step's streams sharing one
  queue in the host's issue order (`sim.engine.queues`).

Each pair is two rows in file order, before and after; the columns that differ name the
change. Where a row gives `measured_peak_gb` (the source's peak allocated memory), the step's
predicted peak is set beside it.

    python benchmarks/ab_pairs.py [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import machine, record  # noqa: E402
from sim.training.predict import predict_rows, read_table  # noqa: E402
from sim.training.row_cells import CHOICES  # noqa: E402

TABLE = ROOT / "benchmarks" / "heldout" / "ab_pairs.csv"


def change(before: dict, after: dict) -> str:
    """The choice columns the two arms differ in, as `col: before -> after`."""
    return "; ".join(
        f"{k}: {before.get(k) or '(recipe)'} -> {after.get(k) or '(recipe)'}"
        for k in CHOICES
        if str(before.get(k, "")) != str(after.get(k, ""))
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1, help="local processes")
    args = ap.parse_args()
    t0 = time.perf_counter()
    table = read_table(TABLE)
    rows = predict_rows(table, workers=args.workers)["rows"]
    wall = time.perf_counter() - t0
    pairs: dict[str, list[tuple[dict, dict]]] = {}
    for cells, r in zip(table, rows):
        if r.get("reason"):
            raise SystemExit(f"{TABLE.name}: pair {r['pair']}: {r['reason']}")
        pairs.setdefault(r["pair"], []).append((cells, r))
    lines = [
        "# Measured A/B pairs predicted (`moesim predict`)",
        "",
        f"Machine: {machine()}. {len(rows)} rows in {wall:.0f} s wall on "
        f"{args.workers} process(es). Table: `benchmarks/heldout/ab_pairs.csv` (each row's "
        "source there). No parameter is fitted to these rows.",
        "",
        "Gain: tokens/s/GPU after the change over before. The recipe is the generic one "
        "(no Megatron-Bridge recipe of these runs), with the row's choice columns.",
        "",
        "| pair | change | measured before | measured after | measured gain | predicted before "
        "| predicted after | predicted gain | gain off by | error before | error after |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    out = []
    for name, arms in pairs.items():
        if len(arms) != 2:
            raise SystemExit(f"{TABLE.name}: pair {name}: expected 2 rows, got {len(arms)}")
        (c0, b), (c1, a) = arms
        what = change(c0, c1)
        m_gain = float(a["tokens_per_s_per_gpu"]) / float(b["tokens_per_s_per_gpu"])
        p_gain = a["predicted_tokens_per_s_per_gpu"] / b["predicted_tokens_per_s_per_gpu"]
        out.append(
            {
                "pair": name,
                "change": what,
                "measured": [b["measured"], a["measured"]],
                "measured_gain": m_gain,
                "predicted_gain": p_gain,
                "gain_error": p_gain / m_gain - 1,
                "rows": [
                    {"tokens_per_s_per_gpu": r["tokens_per_s_per_gpu"], "error": r["error"]}
                    | {"predicted_tokens_per_s_per_gpu": r["predicted_tokens_per_s_per_gpu"]}
                    for r in (b, a)
                ],
                "source": b["source"],
            }
        )
        lines.append(
            f"| {name} | {what} | {b['measured']} | {a['measured']} | {m_gain:.3f} | "
            f"{b['predicted_tokens_per_s_per_gpu']:,.0f} | "
            f"{a['predicted_tokens_per_s_per_gpu']:,.0f} | {p_gain:.3f} | "
            f"{p_gain / m_gain - 1:+.1%} | {b['error']:+.1%} | {a['error']:+.1%} |"
        )
    peaks = {
        (c["pair"], r["ep_overlap"], r.get("recompute", "")): (float(c["measured_peak_gb"]), r)
        for c, r in zip(table, rows)
        if str(c.get("measured_peak_gb", "") or "").strip()
    }
    if peaks:
        lines += [
            "",
            "Peak memory where the source gives it (`max allocated`, printed in MB, read as "
            "10^6 bytes) against the step's predicted peak:",
            "",
            "| pair | ep_overlap | recompute | measured GB | predicted GB | error |",
            "|---|---|---|---|---|---|",
        ]
        for (pair, ov, rc), (gb, r) in peaks.items():
            pred = r["peak_memory_bytes"] / 1e9
            lines.append(f"| {pair} | {ov} | {rc} | {gb:.1f} | {pred:.1f} | {pred / gb - 1:+.1%} |")
    lines += ["", "Sources:", ""]
    lines += [f"- {o['pair']}: {o['source']}" for o in out]
    memory = [
        {"pair": k[0], "ep_overlap": k[1], "recompute": k[2], "measured_gb": gb}
        | {"predicted_gb": r["peak_memory_bytes"] / 1e9}
        for k, (gb, r) in peaks.items()
    ]
    record(
        "ab_pairs",
        {"machine": machine(), "wall_s": wall, "pairs": out, "memory": memory},
        lines,
    )


if __name__ == "__main__":
    main()
