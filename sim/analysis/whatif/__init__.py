"""What-if studies: one base (a run config, a task graph or a measured trace), some changes
(`--set KEY=VALUE`: the keys and their values in `keys`), simulated before and after
(`study`), as `moesim whatif` runs them (`command`).

    r = whatif("my.yaml", ["link.*.bw=*2"])  # r.before, r.after, r.before_trace, ...
"""

from sim.analysis.whatif.command import format_whatif, whatif_command
from sim.analysis.whatif.study import WhatIf, load_base, whatif, with_links, with_speed

__all__ = [
    "WhatIf",
    "format_whatif",
    "load_base",
    "whatif",
    "whatif_command",
    "with_links",
    "with_speed",
]
