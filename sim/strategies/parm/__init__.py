"""Parm (paper 003): dedicated schedules for MoE layers under MP+EP+ESP.

The layer runs on one replica of N_EP * N_ESP ranks (Parm's placement: ESP groups inside a
node, MP groups of N_MP consecutive ranks laid over the same ranks; `parallel: {ep, esp, tp}`
with tp = N_MP, see sim.workload.parallel). Parameters:

- `schedule`: `baseline` (DeepSpeed-MoE's ESP-AllGather, EP-AlltoAll, experts,
  ESP-AllReduce, EP-AlltoAll, ESP-Split), `s1` (PauseMP before the gate), `s2` (PauseMP
  after the gate), or `auto` (the selector of Sec. V: S1 or S2 from per-group alpha-beta fits);
- `saa`: S2's returning all-to-all and MP-AllGather run concurrently (Sec. III-D);
- `tp`, `esp`: N_MP and N_ESP (set from `parallel:` by the run config);
- `algo`: the all-to-all algorithm of the EP and EP&ESP exchanges.

Modules: `volumes` (the bytes and work of every step, Sec. IV), `schedules` (the graphs),
`selector` (Algorithm 1).
"""

from __future__ import annotations

from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph
from sim.strategies.base import Strategy
from sim.strategies.parm.schedules import build_schedule
from sim.strategies.parm.selector import choose
from sim.strategies.parm.volumes import SCHEDULES, check, volumes
from sim.workload.moe import MoELayer

NAME = "parm"


def build(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> TaskGraph:
    deg = check(layer, params["tp"], params["esp"])
    schedule, saa = params["schedule"], params["saa"]
    if not isinstance(saa, bool):
        raise ConfigError(f"strategy.saa: expected true or false, got {saa!r}")
    if schedule not in (*SCHEDULES, "auto"):
        raise ConfigError(
            f"strategy.schedule: expected one of {(*SCHEDULES, 'auto')}, got {schedule!r}"
        )
    selector = None
    if schedule == "auto":
        choice = choose(layer, deg, cluster, saa, params["algo"])
        schedule, selector = choice.schedule, choice.as_meta()
    g = build_schedule(layer, volumes(layer, deg, schedule), passes, saa, params["algo"])
    if selector is not None:
        g.meta["selector"] = selector
    return g


STRATEGY = Strategy(
    name=NAME,
    Params="sim.strategies.params:ParmParams",
    build=build,
    real_layer=None,
    tp_overlay=True,
)
