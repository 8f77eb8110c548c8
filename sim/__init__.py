"""moesim simulator: task graphs of MoE layers replayed on a model of a cluster.

    import sim
    r = sim.run("my.yaml", nodes=4, strategy="pipelined", params={"degree": 8})
    r.summary["makespan_s"], r.trace, r.graph
    sim.compare("my.yaml", ["sequential", "pipelined:degree=4"])   # a DataFrame
    sim.predict("runs.csv")["mape"]   # whole training steps of a table of runs

The names below are loaded on first use (module `__getattr__`), so `import sim` imports
none of pandas, numpy, SimPy or torch: the CLI's start-up and `import sim` stay cheap.
Importing `sim` never imports torch at all; the real executor lives in `exec`.
"""

# The one place the version is written: pyproject.toml reads it (setuptools dynamic
# `attr`, read statically without importing the package), `moesim --version` prints it.
__version__ = "0.1.0"

# what `import sim` exports; each comes from sim.exports when first asked for
__all__ = [
    "RunConfig",
    "RunResult",
    "__version__",
    "compare",
    "demo_config",
    "load_config",
    "plan",
    "predict",
    "replay",
    "run",
    "sweep",
    "whatif",
]


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module 'sim' has no attribute {name!r}")
    from sim import exports

    value = getattr(exports, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
