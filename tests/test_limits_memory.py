"""Size limits that keep a config inside every default limit from exhausting memory (issue 28).

The demo at `nodes: 512` (4,096 GPUs in one EP group) used to build for minutes and peak at
5-6 GB (pipemoe, megatron_ep, fastermoe) or never finish (deepep): what grows is what the
strategy keeps per rank pair of the group (per-peer all-to-allv splits, PipeMoE's derived
all-to-all fit). `limits.max_pairs` bounds P x P x that weight (`sim.strategies.pair_weight`)
before the builder runs, so the heavy strategies are refused while uniform exchanges
(sequential, pipelined) still run 4,096 GPUs in seconds. The CLI runs in a subprocess under
an address-space limit, so that a regression fails the test instead of taking the machine's
memory.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

from sim.config import RunConfig
from sim.core.errors import ConfigError
from sim.core.limits import DEFAULT, applied, parse

AS_LIMIT = 4 * 2**30  # the run must be refused far below this; an overshoot gets MemoryError
DEMO = os.path.join(os.path.dirname(__file__), "..", "sim", "configs", "demo.yaml")


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def _moesim(*argv: str, timeout: float = 30) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MOESIM_PROGRESS="0")
    code = "import sys; from sim.cli import main; sys.exit(main(sys.argv[1:]))"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_bounded,
        env=env,
    )
    return proc, time.monotonic() - t0


@pytest.mark.parametrize("strategy", ["pipemoe", "megatron_ep", "fastermoe", "deepep"])
def test_demo_on_4096_gpus_is_refused_first(strategy):
    proc, _ = _moesim("simulate", DEMO, "--strategy", strategy, "--nodes", "512")
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert "limits.max_pairs" in err and "--limit max_pairs=N" in err
    assert "4,096 x 4,096" in err  # refused before building (the timeout guards a hang)


@pytest.mark.parametrize(
    "nodes, argv",
    [
        (256, ["--strategy", "sequential"]),
        pytest.param(512, ["--strategy", "sequential"], marks=pytest.mark.slow),
        # the demo's 4 chunks exceed the capacity at this scale; 2 chunks of the routing
        # matrix are over limits.max_matrix (a separate bound), raised here
        pytest.param(
            512,
            ["--strategy", "pipelined", "--param", "degree=2", "--limit", "max_matrix=1e8"],
            marks=pytest.mark.slow,
        ),
    ],
)
def test_uniform_exchanges_run_on_thousands_of_gpus(nodes, argv):
    """A uniform all-to-all keeps ~10 bytes a rank pair: 2,048 and 4,096 GPUs in one group
    are under limits.max_pairs and simulate in seconds within the address-space limit."""
    proc, _ = _moesim("simulate", DEMO, *argv, "--nodes", str(nodes), timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{nodes * 8} ranks" in proc.stdout


def test_pair_weights_follow_the_strategy():
    """Uniform exchanges weigh 1; per-peer splits grow with the exchanges per rank (megatron_ep:
    micro-batches x layers x passes); PipeMoE's selector derives a fit over P x P flows."""
    from sim.strategies import DERIVED_FIT_WEIGHT, pair_weight

    layer = RunConfig.demo().workload_for(16).layer
    both = ("fwd", "bwd")
    for name in ("sequential", "pipelined", "tutel", "ted", "lancet", "mpipemoe", "parm"):
        assert pair_weight(name, layer, {}, both) == 1
    assert pair_weight("pipemoe", layer, {}, both) == 1 + DERIVED_FIT_WEIGHT
    assert pair_weight("pipemoe", layer, {"degree": 2}, both) == 1
    assert pair_weight("megatron_ep", layer, {}, both) == 81  # 4 micro x 2 layers x 2 passes
    assert pair_weight("megatron_ep", layer, {"micro": 8}, ("fwd",)) == 81
    assert pair_weight("deepep", layer, {}, both) == 9
    assert pair_weight("fastermoe", layer, {}, both) == 141


def test_max_pairs_is_a_limit_name_and_raises():
    """P x P x the strategy's weight against the limit: megatron_ep forward (weight 41) on
    1,209 GPUs resolves, on 1,210 is refused unless the limit is raised (config or --limit)."""
    assert DEFAULT.max_pairs == 60_000_000
    assert parse(["max_pairs=1e6"]) == {"max_pairs": 1_000_000}
    flat = {
        "topology": "flat-switch",
        "strategy": "megatron_ep",
        "model": {
            "batch": 1,
            "seq_len": 8,
            "model_dim": 8,
            "hidden_dim": 8,
            "experts_per_gpu": 1,
            "top_k": 1,
        },
    }
    raised = 2 * 1210 * 1210 * 41
    for world, limit, ok in ((1209, None, True), (1210, None, False), (1210, raised, True)):
        cfg = RunConfig.from_dict(
            {**flat, "nodes": world} | ({"limits": {"max_pairs": limit}} if limit else {})
        )
        with applied(cfg.size_limits()):
            if ok:
                assert cfg.workload_for(world).layer.world == world
            else:
                with pytest.raises(ConfigError, match=r"1,210 x 1,210 GPUs x 41\).*max_pairs"):
                    cfg.workload_for(world)


def test_all_to_allv_splits_are_bounded_while_the_graph_grows():
    """A graph's all-to-allv splits (members x peers per collective, tens of bytes each) count
    against limits.max_matrix as tasks are added: megatron_ep's layers multiply them."""
    from sim import commands

    cfg = RunConfig.demo().with_overrides(
        strategy="megatron_ep", nodes=4, limits={"max_matrix": 5_000}
    )
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"all-to-allv split entries.*limits\.max_matrix"):
        commands.build_graph(cfg)
    assert time.monotonic() - t0 < 10
