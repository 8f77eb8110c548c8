"""`moesim sweep`: the cross product of a spec's values, one results row per run, resumable:
the spec expanded into validated points (`spec`), one point run to one row wherever it runs
(`run`), the output directory of rows and results (`store`), and the driver that runs the
points on local processes or a Dask cluster (`driver`).

    df = run_sweep("sweep.yaml", out="out/sweep")
"""

from sim.analysis.sweep.driver import run_sweep

__all__ = ["run_sweep"]
