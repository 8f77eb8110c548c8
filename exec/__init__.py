"""moesim's twin executor: runs the simulator's task graphs for real with torch.distributed.

Where things are:

- `exec.runtime`: a TaskGraph on real devices.
  - `runner.run_rank`: one rank of a graph on its device (a thread per stream on CPU, CUDA
    streams and events on GPU), every task timed on rank 0's clock.
  - `launch`: `launch` (N local processes, gloo or NCCL) and `run_under_torchrun`, both
    returning an `ExecResult` (the trace in `sim.analysis.trace.COLUMNS`); `call_ranks` for
    any function.
  - `ops`: tasks as real operations (GEMMs, memory-bound kernels, copies, collectives).
  - `channels`: one process group per communicating set of (rank, stream).
  - `clock`: clock offsets between ranks (ping-pong) and their error bound.
  - `summary`: a measured trace in numbers.
- `exec.layers`: the real MoE layers (top-k gating, capacity, all-to-all) of every strategy,
  checked against `sequential` for equal outputs and gradients.
- `exec.measure`: microbenchmarks and calibration (`microbench`, `timings`: a measured trace
  as calibration rows) and validation runs against the simulator (`validation`).
- `exec.cli`: the `moesim exec`, `calibrate` and `validate` subcommands.

Importing this package (or `exec.cli`) needs nothing beyond the standard library, so `sim`
and `exec` install together without torch; the modules that run things import torch.
"""
