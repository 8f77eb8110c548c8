"""gloo's all-to-all as gloo runs it, in closed form: how a fit at one group size extends to
another on a CPU topology (sim.hardware.costs.host).

torch's ProcessGroupGloo runs `all_to_all_single` as `gloo::alltoall` (equal splits) or
`gloo::alltoallv` (facebookincubator/gloo, gloo/alltoall.cc and gloo/alltoallv.cc); both are,
on each of the n ranks holding B bytes (n chunks):

1. a local memcpy of the rank's own chunk (B / n bytes);
2. for i = 1 .. n - 1: post a send of the chunk for rank (r + i) mod n and a receive of the
   chunk from rank (r - i) mod n (the pairwise order);
3. wait for the n - 1 sends and the n - 1 receives.

Over gloo's TCP transport each peer has its own socket, but a rank's chunks all pass through
its own process (the calling thread writes, the device loop thread reads and finishes the
writes), so the n - 1 exchanges cost one after another what each costs alone: a message's
overhead (preamble, the receiver's ready notification, the syscalls) and the chunk's bytes at
the rank's copy rate. The time of one rank is then

    t(n, B) = (n - 1) * a  +  (B / n) * c  +  ((n - 1) / n) * B * w

with `a` seconds per peer, `w` seconds per byte through the transport and `c` seconds per byte
of the local copy (read and written: 2 / the thread's memory bandwidth). A measured fit
t = alpha + beta * B at n0 ranks fixes a = alpha / (n0 - 1) and w = (beta - c / n0) *
n0 / (n0 - 1), from which the fit at any n follows (and at n0 it is the measured one).
"""

from __future__ import annotations

GLOO_KINDS = frozenset({"all_to_all", "all_to_allv"})


def per_peer(n0: int, alpha: float, beta: float, copy: float) -> tuple[float, float, float]:
    """(a, w, c) of a fit (alpha, beta) measured at `n0` >= 2 ranks, where `copy` is the
    local copy's seconds per byte: a copy dearer than the whole fit allows is capped at it
    (the fit measured it; the model's figure for it is only assumed)."""
    if n0 < 2:
        raise ValueError(f"a gloo all-to-all fit needs 2 or more ranks, got {n0}")
    c = min(copy, beta * n0)
    return alpha / (n0 - 1), max(beta - c / n0, 0.0) * n0 / (n0 - 1), c


def alpha_beta(n: int, a: float, w: float, c: float) -> tuple[float, float]:
    """t(n, B) = alpha + beta * B of `n` ranks (module doc); one rank only copies."""
    return (n - 1) * a, c / n + (n - 1) / n * w


def extrapolate(n0: int, alpha: float, beta: float, n: int, copy: float) -> tuple[float, float]:
    """The fit measured at `n0` ranks carried to `n` ranks as gloo's algorithm grows."""
    return alpha_beta(n, *per_peer(n0, alpha, beta, copy))
