"""moesim simulator: task graphs of MoE layers replayed on a model of a cluster.

Importing `sim` never imports torch; the real executor lives in `exec`.
"""

__version__ = "0.1.0"
