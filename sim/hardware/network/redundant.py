"""Links in series: ones that carry exactly the same flows as another link.

A GPU's route to the fabric crosses its PCIe link, the switch-to-NIC link and the NIC's port,
all carrying the same flows: only the narrowest can ever limit them, and the others are a
third of the solver's work. Two links carry the same flows (with the same multiplicities)
when the sums of their flows' random 64-bit tags agree (wrapping integer sums are exact and
order-free; two different flow sets collide with probability 2^-64). Of each such group, the
link of least capacity (then lowest id) *represents* the group: the solver sees only it, and
the others' load is its load. Finishing flows leave every link of their route, so the groups
hold until the next flows start, when they are formed again.
"""

from __future__ import annotations

import numpy as np

from sim.hardware.network.table import FlowTable

_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: multiplying by it permutes 64-bit values


def representatives(t: FlowTable, cap: np.ndarray) -> np.ndarray:
    """rep[l]: the link that represents l (l itself where no other carries l's flows)."""
    nl = len(cap)
    rep = np.arange(nl)
    live = t.alive[t.all_s]
    lk = t.all_l[live]
    if not len(lk):
        return rep
    # a flow's tag, mixed with its multiplicity's bits, so that 2 flows != 1 flow twice
    tag = t.key[t.all_s[live]] * ((t.all_m[live].view(np.uint64) * _MIX) | np.uint64(1))
    sig = np.zeros(nl, dtype=np.uint64)
    np.add.at(sig, lk, tag)
    used = np.flatnonzero(np.bincount(lk, minlength=nl))
    order = used[np.lexsort((used, cap[used], sig[used]))]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sig[order[1:]] != sig[order[:-1]]
    rep[order] = order[np.flatnonzero(first)[np.cumsum(first) - 1]]
    return rep
