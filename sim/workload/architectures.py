"""Model architectures of whole training runs, read from `architectures.yaml` (each model's
Hugging Face config.json, with its source), and the model FLOPs Megatron counts for them.

`Architecture` describes the model only; how it is split over GPUs is the layout's business
(`sim.training.layout`) and what each GPU runs per micro-batch is `sim.training.ops`'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError
from sim.workload.blocks import MLA

DATA = Path(__file__).with_name("architectures.yaml")


@dataclass(frozen=True)
class Architecture:
    """One model's shapes (the config.json fields; see architectures.yaml)."""

    name: str
    source: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    head_dim: int | None = None  # None: hidden / heads
    gated: bool = True  # SwiGLU: gate and up matrices of `ffn` (or `moe_ffn`) each
    experts: int = 0  # routed experts; 0: a dense model
    top_k: int = 0
    moe_ffn: int = 0
    shared: int = 0
    first_dense: int = 0
    mtp: int = 0
    node_limit: int | None = None
    mla: MLA | None = None
    qk_norm: bool = False
    sliding_window: int | None = None
    sliding_every: int = 0  # every n-th layer (from the first) is banded; 0: none
    attention_sinks: bool = False
    attention_bias: bool = False
    # what Megatron-Bridge's model provider sets beside config.json (see architectures.yaml)
    router_dtype: str = "bf16"  # moe_router_dtype (None: the router runs in the input's bf16)
    expert_bias: bool = False  # add_bias_linear on the experts' fc1 and fc2
    glu_clamp: float | None = None  # activation_func_clamp_value of a clamped GLU
    yarn_factor: float = 0.0  # YaRN RoPE scaling factor (rope_scaling.factor); 0: plain RoPE

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def qk_dim(self) -> int:
        """Dims per head of queries and keys."""
        if self.mla is not None:
            return self.mla.qk_head_dim
        return self.head_dim or self.hidden // self.heads

    @property
    def v_dim(self) -> int:
        if self.mla is not None:
            return self.mla.v_head_dim
        return self.head_dim or self.hidden // self.heads

    def is_moe(self, layer: int) -> bool:
        return self.moe and layer >= self.first_dense

    def is_banded(self, layer: int) -> bool:
        return (
            bool(self.sliding_window)
            and self.sliding_every > 0
            and (layer % self.sliding_every == 0)
        )

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated else 2

    def attention_params(self) -> int:
        """Weights of one layer's attention projections (no norms)."""
        h, q, v = self.hidden, self.qk_dim, self.v_dim
        if self.mla is None:
            kv = self.kv_heads
            w = h * (self.heads * q + kv * q + kv * v) + self.heads * v * h
            return w + ((self.heads + 2 * kv) * q + h if self.attention_bias else 0)
        a = self.mla
        nope = a.qk_nope_head_dim
        qp = (
            h * self.heads * q
            if a.q_lora_rank is None
            else (h * a.q_lora_rank + a.q_lora_rank * self.heads * q)
        )
        kvp = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank * self.heads * (
            nope + a.v_head_dim
        )
        return qp + kvp + self.heads * a.v_head_dim * h

    def mlp_params(self, width: int) -> int:
        return self.mlp_matrices * self.hidden * width

    def active_params_per_token(self, layer: int) -> int:
        """GEMM weights one token passes through in a layer (routed experts: top_k of them)."""
        p = self.attention_params()
        if self.is_moe(layer):
            p += self.mlp_params(self.moe_ffn) * (self.top_k + self.shared)
            p += self.hidden * self.experts  # the router
        else:
            p += self.mlp_params(self.ffn)
        return p

    def total_params(self) -> int:
        p = 2 * self.vocab * self.hidden  # input embedding and output layer (untied)
        for i in range(self.layers):
            p += self.attention_params() + 2 * self.hidden
            if self.is_moe(i):
                p += self.mlp_params(self.moe_ffn) * (self.experts + self.shared)
                p += self.hidden * self.experts
            else:
                p += self.mlp_params(self.ffn)
        return p

    def attention_flops_per_token(self, layer: int, seq: int) -> float:
        """Forward FLOPs of one token's scores and context in a layer: 2 x keys x heads x
        (qk + v dims), over the keys a causal token sees on average (seq / 2), or the band."""
        keys = seq / 2
        if self.is_banded(layer):
            keys = min(float(self.sliding_window or seq), seq / 2)
        return 2.0 * keys * self.heads * (self.qk_dim + self.v_dim)

    def model_flops_per_token(self, seq: int) -> float:
        """Training FLOPs per token as Megatron's `num_floating_point_operations` counts them
        (forward + backward = 3 x forward; causal attention counted once, i.e. half the square;
        the LM head; the MTP modules as extra MoE layers with their own LM head; no
        recomputation). `model TFLOP/s/GPU` = tokens/s/GPU x this / 1e12."""
        fwd = 0.0
        for i in range(self.layers):
            fwd += 2.0 * self.active_params_per_token(i) + self.attention_flops_per_token(i, seq)
        last = self.layers - 1
        for _ in range(self.mtp):  # DeepSeek-V3 Sec. 2.2: a projection of 2h to h and a block
            fwd += 2.0 * (2 * self.hidden * self.hidden + self.active_params_per_token(last))
            fwd += self.attention_flops_per_token(last, seq) + 2.0 * self.vocab * self.hidden
        fwd += 2.0 * self.vocab * self.hidden
        return 3.0 * fwd


_INT_FIELDS = {f.name for f in fields(Architecture) if f.type in ("int", "int | None")}


def _parse(name: str, raw: Any) -> Architecture:
    where = f"{DATA.name}: {name}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of fields")
    known = {f.name for f in fields(Architecture)} - {"name"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}")
    for k, v in raw.items():
        if (
            k in _INT_FIELDS
            and v is not None
            and (isinstance(v, bool) or not isinstance(v, int) or v < 0)
        ):
            raise ConfigError(f"{where}.{k}: expected an integer >= 0, got {v!r}")
    if raw.get("router_dtype", "bf16") not in ("bf16", "fp32"):
        raise ConfigError(f"{where}.router_dtype: expected bf16 or fp32")
    for k in ("glu_clamp", "yarn_factor"):
        v = raw.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
            raise ConfigError(f"{where}.{k}: expected a number >= 0, got {v!r}")
    args = dict(raw)
    args["mla"] = MLA.parse(raw.get("mla"), f"{where}.mla")
    try:
        return Architecture(name=name, **args)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None


@functools.cache
def architectures() -> dict[str, Architecture]:
    import yaml

    raw = yaml.safe_load(DATA.read_text())
    return {name: _parse(name, spec) for name, spec in raw.items()}


def architecture(name: str) -> Architecture:
    known = architectures()
    if name not in known:
        raise ConfigError(f"model {name!r}: unknown architecture (known: {sorted(known)})")
    return known[name]
