"""The MoE layer being simulated: sizes, capacity and routing (who sends how many tokens where).

Notation follows PipeMoE Table I / Tutel: B sequences of L tokens per GPU (T = B*L tokens),
model dim M, expert hidden dim H, E experts in total over P GPUs (E/P local experts), top-k
gating with capacity factor f, so each expert takes at most C = ceil(k*f*T/E) tokens from each
GPU (GShard/Switch token dropping).

Routing models (`sim.workload.routing`):
- uniform: every (GPU, expert) buffer is full; the all-to-all moves the padded [E, C, M]
  buffer (Tutel/DeepSpeed style), so all peers exchange equal bytes.
- zipf, lognormal, imbalance (W0-W7), replay (a recorded router map), matrix (tokens[p][e]
  given inline or as a CSV / .npy / JSON file): per-(GPU, expert) choices; only real tokens
  move (all-to-allv) and each GPU's experts compute the rows they receive, except in the
  strategies that exchange the padded buffer whatever the routing (Tutel: `padded`).

Capacity. A capacity-bound layer keeps at most C per (GPU, expert) and drops the rest. A
dropless layer (`dropless: true`, as Megatron-Core, DeepSpeed and DeepSeek train) keeps
every choice: C becomes the largest count, so buffers, all-to-allv splits and expert GEMM
rows follow the loads and the hottest GPU sets the pace.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import ConfigError
from sim.hardware.costs.compute import DTYPE_BYTES
from sim.workload.routing import KINDS, routed

ROUTING_KINDS = KINDS


def expert_capacity(tokens: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """C = ceil(k * f * T / E): slots each expert gives each GPU (GShard / Switch)."""
    return max(1, math.ceil(top_k * capacity_factor * tokens / experts))


def check_sizes(prefix: str, ints: dict[str, Any], capacity_factor: float) -> None:
    """The checks every MoE layer description needs (`ints` holds experts, world, top_k)."""
    for name, v in ints.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{prefix}.{name}: expected a positive integer, got {v!r}")
    experts, world, top_k = ints["experts"], ints["world"], ints["top_k"]
    # Fewer experts than GPUs (a divisor of them) slices each expert over world/experts GPUs
    # (Tutel Sec. 3.2); only strategies that slice experts accept such a layer.
    if experts % world and world % experts:
        raise ConfigError(
            f"{prefix}.experts: {experts} experts cannot be spread evenly over {world} GPUs "
            f"(need a multiple of {world}, or a divisor of it for layouts that slice experts)"
        )
    if top_k > experts:
        raise ConfigError(f"{prefix}.top_k: {top_k} exceeds the {experts} experts")
    if not capacity_factor > 0:
        raise ConfigError(f"{prefix}.capacity_factor: must be > 0, got {capacity_factor}")


@dataclass(frozen=True)
class MoELayer:
    """One MoE layer's sizes and routing over its expert-parallel GPUs."""

    batch: int  # B, sequences per GPU
    seq_len: int  # L
    model_dim: int  # M
    hidden_dim: int  # H
    experts: int  # E, total
    world: int  # P, GPUs in the expert-parallel group
    top_k: int = 1
    capacity_factor: float = 1.0
    dtype: str = "bf16"
    routing: dict[str, Any] = field(default_factory=lambda: {"kind": "uniform"})
    dropless: bool = False  # keep every choice: capacity follows the loads (module doc)

    def __post_init__(self) -> None:
        check_sizes(
            "model",
            {
                n: getattr(self, n)
                for n in (
                    "batch",
                    "seq_len",
                    "model_dim",
                    "hidden_dim",
                    "experts",
                    "world",
                    "top_k",
                )
            },
            self.capacity_factor,
        )
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError(
                f"model.dtype: expected one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}"
            )
        if not isinstance(self.dropless, bool):
            raise ConfigError(f"model.dropless: expected true or false, got {self.dropless!r}")
        kind = self.routing.get("kind")
        if kind not in ROUTING_KINDS:
            raise ConfigError(f"model.routing.kind: expected one of {ROUTING_KINDS}, got {kind!r}")
        if kind != "uniform":
            _ = self.tokens_matrix  # check the routing parameters now, not mid-build

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    def padded(self) -> MoELayer:
        """The layer as a padded [E, C, M] exchange moves it (Tutel, GShard): every (GPU,
        expert) buffer full whatever the routing, the same C (a dropless layer's: the largest
        load, Tutel's dynamic capacity), so that its all-to-alls and expert GEMMs are those
        of uniform routing at that capacity (the gate still drops what it drops)."""
        if self.uniform:
            return self
        C = self.capacity
        k, T, E = self.top_k, self.tokens, self.experts
        f = C * E / (k * T)  # the factor whose capacity is C (the formula's ceil of k*f*T/E)
        while expert_capacity(T, E, k, f) > C:  # float rounding above C
            f = math.nextafter(f, 0.0)
        return replace(self, routing={"kind": "uniform"}, dropless=False, capacity_factor=f)

    @property
    def local_experts(self) -> int:
        return self.experts // self.world

    @property
    def expert_shards(self) -> int:
        """GPUs each expert is sliced over: world/experts when experts < world, else 1."""
        return max(1, self.world // self.experts)

    @property
    def capacity(self) -> int:
        if not self.dropless:
            return expert_capacity(self.tokens, self.experts, self.top_k, self.capacity_factor)
        if self.uniform:  # k*T/E choices per expert, rounded up
            return expert_capacity(self.tokens, self.experts, self.top_k, 1.0)
        return max(1, int(self.routed_matrix.max()))

    @property
    def elem(self) -> float:
        return DTYPE_BYTES[self.dtype]

    @property
    def uniform(self) -> bool:
        return self.routing.get("kind") == "uniform"

    @cached_property
    def tokens_matrix(self) -> np.ndarray:
        """[P, E] tokens GPU p sends to expert e, after capacity dropping."""
        return np.minimum(self.routed_matrix, self.capacity)

    @cached_property
    def routed_matrix(self) -> np.ndarray:
        """[P, E] choices GPU p's gate makes for expert e, before capacity dropping (those
        beyond C are dropped); uniform routing has no gate of its own: every buffer full."""
        kind = self.routing["kind"]
        if kind == "uniform":
            C = self.capacity
            return np.full((self.world, self.experts), C, dtype=np.int64)
        if kind == "matrix":
            P, E = self.world, self.experts
            m = _load_matrix(self.routing)
            if m.shape != (P, E) or (m < 0).any():
                raise ConfigError(
                    f"model.routing.tokens: expected a {P}x{E} matrix of non-negative counts, "
                    f"got shape {m.shape}"
                )
            return m.astype(np.int64)
        return routed(self.routing, self.world, self.experts, self.tokens, self.top_k)

    def chunk_tokens(self, degree: int) -> np.ndarray:
        """[r, P, E] tokens per capacity chunk: chunk j holds capacity slots [jC/r, (j+1)C/r)."""
        C = self.capacity
        bounds = [C * j // degree for j in range(degree + 1)]
        t = self.tokens_matrix
        return np.stack([np.clip(t - lo, 0, hi - lo) for lo, hi in zip(bounds, bounds[1:])])

    def chunk_capacity(self, degree: int) -> list[int]:
        C = self.capacity
        return [C * (j + 1) // degree - C * j // degree for j in range(degree)]


def _load_matrix(routing: dict[str, Any]) -> np.ndarray:
    """`tokens: [[...]]` inline, or `file:` a CSV / .npy / JSON matrix (e.g. from a trace)."""
    unknown = set(routing) - {"kind", "tokens", "file"}
    if unknown or ("tokens" in routing) == ("file" in routing):
        raise ConfigError("model.routing: a matrix needs exactly one of 'tokens' or 'file'")
    if "tokens" in routing:
        try:
            return np.asarray(routing["tokens"], dtype=float)
        except (TypeError, ValueError):
            return np.zeros(0)
    path = Path(str(routing["file"]))
    try:
        if path.suffix == ".npy":
            return np.load(path).astype(float)
        if path.suffix == ".json":
            return np.asarray(json.loads(path.read_text()), dtype=float)
        return np.loadtxt(path, delimiter=",", ndmin=2)
    except FileNotFoundError:
        raise ConfigError(f"model.routing.file: {path} not found") from None
    except (ValueError, json.JSONDecodeError) as e:
        raise ConfigError(f"model.routing.file: {path} is not a numeric matrix ({e})") from None
