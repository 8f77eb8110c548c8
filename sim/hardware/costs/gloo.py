"""gloo's all-to-all as gloo runs it, in closed form: how a fit at one group size extends to
another on a CPU topology (sim.hardware.costs.host).

torch's ProcessGroupGloo runs `all_to_all_single` as `gloo::alltoall` (equal splits) or
`gloo::alltoallv` (facebookincubator/gloo, gloo/alltoall.cc and gloo/alltoallv.cc); both are,
on each of the n ranks holding B bytes (n chunks):

1. a local memcpy of the rank's own chunk (B / n bytes);
2. for i = 1 .. n - 1: post a send of the chunk for rank (r + i) mod n and a receive of the
   chunk from rank (r - i) mod n (the pairwise order), without waiting in between;
3. wait for the n - 1 sends and the n - 1 receives.

The n - 1 exchanges are posted at once, but a rank's chunks all pass through its own
transport (gloo's TCP pair writes from the calling thread and reads on the device loop
thread), one after another, and the calling thread then waits for the n - 1 sends and the
n - 1 receives one after another (a wake-up each). So each peer adds a start-up `a` and its
chunk's bytes, and the time of one rank is

    t(n, B) = (n - 1) * a  +  (B / n) * c  +  (n - 1) * (B / n) * w

the local copy at `c` seconds per byte (read and written: 2 / the thread's memory bandwidth)
and n - 1 chunks of B / n bytes at `w` seconds per byte through the transport. A measured fit
t = alpha + beta * B at n0 ranks fixes a = alpha / (n0 - 1) and w = (beta - c / n0) * n0 /
(n0 - 1), from which the fit at any n follows (and at n0 it is the measured one).

Measured on this project's 2-core host (benchmarks/results/cpu_host_model.md: gloo's
all-to-all alone at 2, 3 and 4 ranks, three runs): alpha at 4 ranks is 2.9-3.1x the 2-rank
one (the model: 3x), beta grows as (n - 1) / n within the noise at 3 ranks and ~17% above
it at 4 ranks on 2 cores (where the transfers share the cores: sim.hardware.costs.host).
"""

from __future__ import annotations

GLOO_KINDS = frozenset({"all_to_all", "all_to_allv"})


def per_peer(n0: int, alpha: float, beta: float, copy: float) -> tuple[float, float, float]:
    """(a, w, c) of a fit (alpha, beta) measured at `n0` >= 2 ranks, where `copy` is the
    local copy's seconds per byte: a copy dearer than the whole fit allows is capped at it
    (the fit measured it; the model's figure for it is a separate measurement)."""
    if n0 < 2:
        raise ValueError(f"a gloo all-to-all fit needs 2 or more ranks, got {n0}")
    c = min(copy, beta * n0)
    return alpha / (n0 - 1), (beta - c / n0) * n0 / (n0 - 1), c


def alpha_beta(n: int, a: float, w: float, c: float) -> tuple[float, float]:
    """t(n, B) = alpha + beta * B of `n` ranks (module doc)."""
    return (n - 1) * a, c / n + (n - 1) / n * w


def extrapolate(n0: int, alpha: float, beta: float, n: int, copy: float) -> tuple[float, float]:
    """The fit measured at `n0` ranks carried to `n` ranks as gloo's algorithm grows."""
    return alpha_beta(n, *per_peer(n0, alpha, beta, copy))
