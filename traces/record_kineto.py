"""Record a PyTorch profiler (Kineto) trace of one real MoE training step on 2 gloo ranks.

    PYTHONPATH=$PWD python traces/record_kineto.py [--out traces/kineto-gloo-2r]

Each rank runs the real layer of `exec.layers.moe` (gate, top-k with capacity, encode, the
`pipelined` strategy's chunked all-to-alls on their own threads, experts, decode) forward and
backward, with an SGD update, under `torch.profiler` with a schedule of one warm-up step and
one active step, so the file holds one `ProfilerStep#1`. Every rank writes its own Chrome-trace
JSON (gzipped), as `torch.profiler.tensorboard_trace_handler` would: `rank{r}.json.gz`.
The layer is small on purpose: the traces are shipped in the repository (< 200 KB each).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import platform
import sys
from pathlib import Path

# the layer; small enough that one step is a few tens of milliseconds on a 2-core machine
LAYER = dict(tokens=256, model_dim=128, hidden_dim=512, experts=4, top_k=2, capacity_factor=1.0)
STRATEGY, PARAMS = "pipelined", {"degree": 2, "order": "tutel"}


def rank_job(rank: int, world: int, out: str) -> dict:
    """One rank: two steps (one warm-up, one recorded) of forward, backward and SGD."""
    import torch
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile, schedule

    from exec.layers.moe import Comms, DistMoE, MoESpec, make_output_grad, make_tokens

    spec = MoESpec(world=world, **LAYER)
    device = torch.device("cpu")
    moe = DistMoE(spec, rank, Comms(rank, world, 60.0, device), device)
    opt = torch.optim.SGD(moe.parameters(), lr=1e-3)
    x0, dy = make_tokens(spec, rank), make_output_grad(spec, rank)
    path = Path(out) / f"rank{rank}.json.gz"
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
        record_shapes=True,
        # the strategy's communication threads start inside the step: profile them too
        experimental_config=_ExperimentalConfig(profile_all_threads=True),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            y, _ = moe(x0.clone().requires_grad_(True), STRATEGY, PARAMS)
            (y * dy).sum().backward()
            opt.step()
            prof.step()
    return {"rank": rank, "file": str(path), "bytes": path.stat().st_size}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="traces/kineto-gloo-2r", help="output directory")
    p.add_argument("--nprocs", type=int, default=2)
    a = p.parse_args(argv)
    import torch

    from exec.runtime.launch import call_ranks

    Path(a.out).mkdir(parents=True, exist_ok=True)
    # the job must be importable by name in the ranks' fresh interpreters, not as __main__
    job = importlib.import_module("traces.record_kineto").rank_job
    res = call_ranks(job, (str(Path(a.out).resolve()),), a.nprocs, backend="gloo")
    for r in res:
        print(f"rank {r['rank']}: {r['file']} ({r['bytes'] / 1e3:.1f} kB)")
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    print(f"machine: {cpu}, nproc {os.cpu_count()}, torch {torch.__version__}, {sys.platform}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
