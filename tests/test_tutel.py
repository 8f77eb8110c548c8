"""Tutel's adaptive pipelining: Algorithm 2 over (degree x all-to-all algorithm)."""

from __future__ import annotations

import pytest

from sim.costs import CostModel
from sim.errors import ConfigError
from sim.search import tutel_online
from sim.strategies import Cluster, build
from sim.strategies.tutel import CANDIDATES, OnlineSearch
from sim.topology import Topology
from sim.workload import MoELayer


def test_search_tries_each_strategy_once_per_bucket_then_keeps_the_best():
    times = {s: 1.0 + i for i, s in enumerate(reversed(CANDIDATES))}  # the last is fastest
    search = OnlineSearch(bucket_len=0.5)
    seen = []
    for _ in range(len(CANDIDATES)):
        s = search.get(1.0)
        seen.append(s)
        search.optimize(1.0, s, times[s])
    assert sorted(seen) == sorted(CANDIDATES)  # every strategy once, no repeats
    assert search.get(1.0) == CANDIDATES[-1]
    # a new f in the same bucket reuses the bucket's knowledge (times normalised by f)
    assert search.get(1.3) == CANDIDATES[-1]
    # one outside it starts trying again
    assert search.get(2.0) == CANDIDATES[0]
    assert [b.fs for b in search.buckets] == [[1.0, 1.3], [2.0]]


def test_bad_search_settings():
    with pytest.raises(ConfigError):
        OnlineSearch(bucket_len=0)
    with pytest.raises(ConfigError):
        OnlineSearch(candidates=())


# Tutel Table 6 settings (samples/step x tokens/sample, M, V, dE), on 16 and 64 A100s
SETTINGS = [
    (16, dict(batch=8, seq_len=512, model_dim=1024, hidden_dim=1024), 1),
    (16, dict(batch=16, seq_len=1024, model_dim=2048, hidden_dim=4096), 2),
    (64, dict(batch=8, seq_len=512, model_dim=1024, hidden_dim=2048), 1),
]


@pytest.mark.parametrize("gpus,sizes,per_gpu", SETTINGS)
def test_algorithm_2_is_never_worse_than_the_best_fixed_choice(gpus, sizes, per_gpu):
    topo = Topology.load("dgx-a100", nodes=gpus // 8)
    cluster = Cluster(topo, CostModel.build(topo, {}))
    layer = MoELayer(experts=per_gpu * gpus, world=gpus, top_k=2, **sizes)
    fs = [1.0, 1.2, 2.0, 2.3, 4.0, 4.4] * 10  # capacity factor changing per iteration
    history, search, timer = tutel_online(layer, cluster, fs)
    assert len(search.buckets) == 3
    for b in search.buckets:
        assert set(b.tried) == set(CANDIDATES)  # Algorithm 2 has tried every candidate
        picked = sum(timer(f, search.get(f)) for f in b.fs)
        best_fixed = min(sum(timer(f, s) for f in b.fs) for s in CANDIDATES)
        assert picked <= best_fixed * (1 + 1e-12)
    # once converged, the last iterations only exploit
    last = history[-6:]
    assert all(timer(h["f"], (h["degree"], h["algo"])) == h["time_s"] for h in last)
    assert all(search.get(h["f"]) == (h["degree"], h["algo"]) for h in last)


def test_tutel_strategy_builds_its_choice():
    layer = MoELayer(batch=2, seq_len=256, model_dim=256, hidden_dim=512, experts=16, world=16)
    g = build("tutel", layer, {"degree": 4, "algo": "2dh"}, ("fwd",))
    assert g.meta["degree"] == 4 and g.meta["order"] == "tutel"
    assert {t.algo for t in g if t.kind == "all_to_all"} == {"2dh"}
    with pytest.raises(ConfigError, match="algo"):
        build("tutel", layer, {"algo": "pairwise"}, ("fwd",))
