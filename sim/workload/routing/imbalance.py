"""NVIDIA's token-imbalance workloads W0-W7 (NVIDIA/Megatron-LM issue #6757, PR #7488,
`benchmarks/moe/token_imbalance`), rebuilt from the PR's definitions.

Each workload is a rule for every token's k distinct experts, a function of (workload, seed,
step) only: every source rank routes the same way (the PR seeds its generator with the
workload, seed and step, not the rank). With E experts and top-k, the hot block is the first
hw = max(k, E // 4) experts; `pick(pool)` takes k distinct experts of `pool` uniformly.
- W0 balanced: token t takes experts (t*k + j) mod E: exactly k*T/E each.
- W1 hot expert set, W2 hot rank: three tokens in four (t mod 4 != 0) pick(hot block), the
  rest pick(all). The PR codes both the same way; W2's hot block is one rank's experts when
  E/EP <= hw (E=8, EP=4). They differ only in their draws here too.
- W3 spread hot: three in four pick among the even experts {2i mod E, i < max(k, E//2)}.
- W4 source-ragged: pick(all) for every token (the PR's code has no ragged sources: every
  rank has T tokens).
- W5 zero-expert rank: pick(upper half of the experts): the lower half's ranks get nothing.
- W6 rotating hotspot: W1 with the hot block moved by hw every 3 steps.
- W7 burst: pick(all), except on every fourth step (step mod 4 == 3), where even tokens
  pick(hot block).
The PR times three modes: dispatch only (permute, all-to-allv, sort, a stand-in expert
loop, combine; the router not run), the MoE layer forward and backward, and a training step
(where its real router decides and the workload is unused). In moesim these are passes
[fwd] and [fwd, bwd] of a dropless layer (`benchmarks/imbalance_workloads.py`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from sim.core.errors import ConfigError

WORKLOADS = ("W0", "W1", "W2", "W3", "W4", "W5", "W6", "W7")
NAMES = {
    "W0": "balanced",
    "W1": "hot expert set",
    "W2": "hot rank",
    "W3": "spread hot experts",
    "W4": "source-ragged",
    "W5": "zero-expert rank",
    "W6": "rotating hotspot",
    "W7": "burst",
}
FIELDS = {"kind", "workload", "seed", "step"}
MAX_DRAWS = 2**26  # tokens x pool entries drawn for one map


def _rng(workload: str, seed: int, step: int) -> np.random.Generator:
    digest = hashlib.sha256(f"{workload}|{seed}|{step}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "big"))


def _pick(rng: np.random.Generator, pool: np.ndarray, n: int, k: int) -> np.ndarray:
    """[n, k] experts, each row k distinct members of `pool` drawn uniformly."""
    if n == 0:
        return np.zeros((0, k), dtype=np.int64)
    order = np.argsort(rng.random((n, pool.size)), axis=1)[:, :k]
    return pool[order]


def choices(workload: str, experts: int, top_k: int, tokens: int, seed: int, step: int):
    """[T, k] expert ids of one rank's tokens (module doc)."""
    E, k, T = experts, top_k, tokens
    if T * E > MAX_DRAWS:
        raise ConfigError(
            f"model.routing: the {workload} map of {T:,} tokens over {E:,} experts exceeds "
            f"{MAX_DRAWS:,} draws"
        )
    everyone = np.arange(E)
    hw = max(k, E // 4)
    t = np.arange(T)
    if workload == "W0":
        return (t[:, None] * k + np.arange(k)[None, :]) % E
    rng = _rng(workload, seed, step)
    out = np.empty((T, k), dtype=np.int64)
    if workload in ("W1", "W2", "W3", "W6"):
        if workload == "W3":
            hot = np.unique((2 * np.arange(max(k, E // 2))) % E)
            if hot.size < k:
                hot = everyone
        else:
            base = ((step // 3) * hw) % E if workload == "W6" else 0
            hot = (base + np.arange(hw)) % E
        hot_tokens = t % 4 != 0
        out[hot_tokens] = _pick(rng, hot, int(hot_tokens.sum()), k)
        out[~hot_tokens] = _pick(rng, everyone, int((~hot_tokens).sum()), k)
        return out
    if workload == "W4":
        return _pick(rng, everyone, T, k)
    if workload == "W5":
        upper = np.arange(E // 2, E)
        if upper.size < k:
            raise ConfigError(
                f"model.routing.workload: W5 routes to the upper {upper.size} experts, fewer "
                f"than top_k {k}"
            )
        return _pick(rng, upper, T, k)
    if workload == "W7":
        burst = step % 4 == 3
        hot_tokens = (t % 2 == 0) if burst else np.zeros(T, dtype=bool)
        out[hot_tokens] = _pick(rng, np.arange(hw) % E, int(hot_tokens.sum()), k)
        out[~hot_tokens] = _pick(rng, everyone, int((~hot_tokens).sum()), k)
        return out
    raise ConfigError(
        f"model.routing.workload: expected one of {list(WORKLOADS)}, got {workload!r}"
    )


def routed(routing: dict[str, Any], world: int, experts: int, tokens: int, top_k: int):
    """[P, E]: every rank's counts, the same row (module doc)."""
    unknown = set(routing) - FIELDS
    if unknown:
        raise ConfigError(f"model.routing: unknown field(s) {sorted(unknown)} for imbalance")
    ints = {}
    for name in ("seed", "step"):
        v = routing.get(name, 0)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ConfigError(f"model.routing.{name}: expected an integer >= 0, got {v!r}")
        ints[name] = v
    w = routing.get("workload")
    if w not in WORKLOADS:
        raise ConfigError(f"model.routing.workload: expected one of {list(WORKLOADS)}, got {w!r}")
    ch = choices(w, experts, top_k, tokens, ints["seed"], ints["step"])
    row = np.bincount(ch.ravel(), minlength=experts).astype(np.int64)
    return np.tile(row, (world, 1))
