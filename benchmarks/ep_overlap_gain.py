"""Megatron-Core's EP overlap, predicted against measured A/B pairs (issues 23 and 24).

Each pair is one run measured twice, with `--overlap-moe-expert-parallel-comm` off and on,
all else equal (`benchmarks/heldout/ep_overlap_pairs.csv`, each row with its source: the
Megatron-Bridge pull requests that measured them). None of them is in the table
`gpu.kernels.launch_s` is fitted to. What they check is the overlap's gain, the ratio of
the two runs' throughputs, which a constant error of the step model cancels out of: the
merged forward / backward pairs, the dispatcher's kernels holding SMs while they run
(`sim.training.contention.ep_hold`), and the communication hidden.

    python benchmarks/ep_overlap_gain.py [--workers 2]
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

TABLE = ROOT / "benchmarks" / "heldout" / "ep_overlap_pairs.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1, help="local processes")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = predict_rows(read_table(TABLE), workers=args.workers)["rows"]
    wall = time.perf_counter() - t0
    pairs: dict[str, dict[str, dict]] = {}
    for r in rows:
        if r.get("reason"):
            raise SystemExit(f"{TABLE.name}: pair {r['pair']}: {r['reason']}")
        pairs.setdefault(r["pair"], {})[r["ep_overlap"]] = r
    lines = [
        "# Megatron-Core's EP overlap: measured A/B pairs predicted (`moesim predict`)",
        "",
        f"Machine: {machine()}. {len(rows)} rows in {wall:.0f} s wall on "
        f"{args.workers} process(es). Table: `benchmarks/heldout/ep_overlap_pairs.csv` (each "
        "row's source there). No parameter is fitted to these rows.",
        "",
        "Gain: tokens/s/GPU with EP overlap over without. The recipe is the generic one "
        "(no Megatron-Bridge recipe of these releases for H100 BF16), with the row's "
        "dispatcher and overlap.",
        "",
        "| pair | dispatcher | measured off | measured on | measured gain | predicted off "
        "| predicted on | predicted gain | gain off by | error off | error on |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    out = []
    for name, p in pairs.items():
        off, on = p["off"], p["on"]
        m_gain = float(on["tokens_per_s_per_gpu"]) / float(off["tokens_per_s_per_gpu"])
        p_gain = on["predicted_tokens_per_s_per_gpu"] / off["predicted_tokens_per_s_per_gpu"]
        out.append(
            {
                "pair": name,
                "dispatcher": off["dispatcher"],
                "measured": [off["measured"], on["measured"]],
                "measured_gain": m_gain,
                "predicted_gain": p_gain,
                "gain_error": p_gain / m_gain - 1,
                "rows": [
                    {k: r[k] for k in ("ep_overlap", "tokens_per_s_per_gpu", "error")}
                    | {"predicted_tokens_per_s_per_gpu": r["predicted_tokens_per_s_per_gpu"]}
                    for r in (off, on)
                ],
                "source": off["source"],
            }
        )
        lines.append(
            f"| {name} | {off['dispatcher']} | {off['measured']} | {on['measured']} | "
            f"{m_gain:.3f} | {off['predicted_tokens_per_s_per_gpu']:,.0f} | "
            f"{on['predicted_tokens_per_s_per_gpu']:,.0f} | {p_gain:.3f} | "
            f"{p_gain / m_gain - 1:+.1%} | {off['error']:+.1%} | {on['error']:+.1%} |"
        )
    lines += ["", "Sources:", ""]
    lines += [f"- {o['pair']}: {o['source']}" for o in out]
    record("ep_overlap_gain", {"machine": machine(), "wall_s": wall, "pairs": out}, lines)


if __name__ == "__main__":
    main()
