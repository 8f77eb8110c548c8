"""moesim's twin executor: runs the simulator's task graphs for real with torch.distributed.

Where things are:

- `exec.runner`: `run_rank`, one rank of a TaskGraph on its device (a thread per stream on
  CPU, CUDA streams and events on GPU), every task timed on rank 0's clock.
- `exec.launch`: `launch` (N local processes, gloo or NCCL) and `run_under_torchrun`, both
  returning an `ExecResult` (the trace in sim.trace.COLUMNS); `call_ranks` for any function.
- `exec.ops`: tasks as real operations (GEMMs, memory-bound kernels, copies, collectives).
- `exec.channels`: one process group per communicating set of (rank, stream).
- `exec.clock`: clock offsets between ranks (ping-pong) and their error bound.
- `exec.moe`: a real MoE layer (top-k gating, capacity, all-to-all) and its strategies,
  checked against each other for equal outputs.
- `exec.measure`, `exec.summary`: a measured trace as calibration rows, and in numbers.
- `exec.cli`: the `moesim exec` subcommand.

Importing this package (or `exec.cli`) needs nothing beyond the standard library, so `sim`
and `exec` install together without torch; the modules that run things import torch.
"""
