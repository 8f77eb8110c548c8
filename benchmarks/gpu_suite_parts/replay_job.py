"""The `replay` part's process: the executor's transformer block (`exec.layers.block`:
attention + the MoE layer, sequential strategy) as one training step (forward, backward, SGD)
on one rank, timed without the profiler, then two steps under torch.profiler (one warm-up,
one recorded: `ProfilerStep#1`), its Kineto trace written as `kineto/rank0.json.gz`.

    python benchmarks/gpu_suite_parts/replay_job.py --out DIR [--dry-run]

Each step ends with a synchronize, so the recorded step spans the GPU's work. Writes
DIR/job.json: the unprofiled steps' times and what ran. Imports from exec at one place
(`_block`), so that moving exec's modules touches one function."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (tokens per rank = batch x seq, model dim, expert hidden, experts, heads, batch)
SHAPE = dict(tokens=4096, model_dim=2048, hidden_dim=8192, experts=2, heads=16, batch=4)
SHAPE_DRY = dict(tokens=128, model_dim=32, hidden_dim=64, experts=2, heads=2, batch=2)
TIMED_STEPS = 5


def _block(shape: dict, device, dtype):
    """The executor's block on one rank, its tokens and output gradient."""
    from exec.layers.block import BlockSpec, DistBlock
    from exec.layers.moe import Comms, MoESpec, make_output_grad, make_tokens

    moe = MoESpec(
        tokens=shape["tokens"],
        model_dim=shape["model_dim"],
        hidden_dim=shape["hidden_dim"],
        experts=shape["experts"],
        world=1,
        top_k=2,
        capacity_factor=1.2,
    )
    spec = BlockSpec(moe, batch=shape["batch"], heads=shape["heads"])
    blk = DistBlock(spec, 0, Comms(0, 1, 60.0, device), device).to(dtype)
    x0 = make_tokens(moe, 0).to(device=device, dtype=dtype)
    dy = make_output_grad(moe, 0).to(device=device, dtype=dtype)
    return blk, x0, dy


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not a.dry_run
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(0)
    else:
        torch.set_num_threads(1)
    # one rank: an in-process store is the whole rendezvous
    dist.init_process_group(
        "nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1
    )
    dtype = torch.bfloat16 if cuda else torch.float32  # a CPU runs bf16 as fp32 (exec's stand-in)
    shape = SHAPE_DRY if a.dry_run else SHAPE
    blk, x0, dy = _block(shape, device, dtype)
    opt = torch.optim.SGD(blk.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        y = blk(x0.clone().requires_grad_(True), "sequential", {})
        (y * dy).sum().backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()

    for _ in range(2):  # warm-up: allocator, cuBLAS handles, NCCL communicators
        step()
    times = []
    for _ in range(TIMED_STEPS):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    trace = out / "kineto" / "rank0.json.gz"
    trace.parent.mkdir(exist_ok=True)
    extra = {}
    try:  # threads the step starts itself (none in `sequential`; kept for other strategies)
        from torch._C._profiler import _ExperimentalConfig

        extra["experimental_config"] = _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):
        pass
    with profile(
        activities=acts,
        schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
        record_shapes=True,
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(trace)),
        **extra,
    ) as prof:
        for _ in range(2):
            step()
            prof.step()
    job = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "backend": "nccl" if cuda else "gloo",
        "dtype": str(dtype).replace("torch.", ""),
        "shape": shape,
        "strategy": "sequential",
        "step_s_median": statistics.median(times),
        "step_s": times,
        "trace": str(trace.relative_to(out)),
        "trace_bytes": trace.stat().st_size if trace.exists() else 0,
    }
    (out / "job.json").write_text(json.dumps(job, indent=2) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
