"""The parts of `benchmarks/gpu_suite.py`, one module per part (see `plan` for the list, their
priority order and their expected seconds on an H100). Nothing here imports torch at import
time: `gpu_suite.py --help` and `--plan` run without it."""
