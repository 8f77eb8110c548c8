"""moesim's twin executor: runs the simulator's task graphs for real with torch.distributed.

Not built yet (see the executor issue); importing it needs nothing beyond the standard library
so that `sim` and `exec` install together without torch.
"""
