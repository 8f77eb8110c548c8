"""The real MoE layers: `moe` (the layer and its parts), the strategies registered by name in
`registry` (`pipelined`, `fastermoe`, `mpipemoe`, `ted`, `deepep` and `sliced` Tutel, whose cases
`layouts` runs), and `run` (every variant on every rank, compared against `sequential`).
Schedules over micro-batches or pipeline stages (`ep_overlap`: megatron_ep, `dualpipe`) are
registered apart, in `registry.SCHEDULE_LAYERS`. Each layer is registered under its own
name; which one runs a strategy is the strategy's `real_layer` (sim.strategies.base), so the
import order below does not matter.
"""

from exec.layers import pipelined  # noqa: F401, I001
from exec.layers import deepep, fastermoe, lancet, layouts, mpipemoe  # noqa: F401
from exec.layers import dualpipe, ep_overlap  # noqa: F401  # registry.SCHEDULES
