"""Which layers each virtual pipeline stage holds: Megatron-Core's pipeline layouts.

A layout string (`--pipeline-model-parallel-layout`) lists the virtual stages in order,
separated by `|`: `E` the embedding, `t` a transformer layer, `m` an MTP module, `L` the LM
head and loss; `X*n` repeats X n times and parentheses group, e.g. DeepSeek-V3's
`Et*4|(t*4|)*14tmL` (16 stages). Without one, the layers are split as evenly as the count
allows, the first stages taking one more; `account_for_embedding` / `account_for_loss`
(Megatron-Core's `--account-for-embedding-in-pipeline-split` and `...-loss-...`) count the
embedding and the loss as one layer each in that split.
"""

from __future__ import annotations

import re

from sim.core.errors import ConfigError

TOKENS = set("EtmL")


def expand(layout: str, where: str = "pipeline_layout") -> str:
    """The layout with every repetition written out."""
    s = layout.replace(" ", "").replace(",", "")
    group = re.compile(r"\(([^()]*)\)\*(\d+)")
    single = re.compile(r"([EtmL])\*(\d+)")
    for _ in range(100):
        new = group.sub(lambda m: m.group(1) * int(m.group(2)), s)
        new = single.sub(lambda m: m.group(1) * int(m.group(2)), new)
        if new == s:
            break
        s = new
    bad = set(s) - TOKENS - {"|"}
    if bad:
        raise ConfigError(
            f"{where}: {layout!r}: unknown symbol(s) {sorted(bad)} (E, t, m, L, |, *n, ())"
        )
    return s


def parse(layout: str, stages: int, layers: int, where: str = "pipeline_layout") -> list[str]:
    """Per virtual stage, its symbols; checked against the stage and layer counts."""
    parts = expand(layout, where).split("|")
    if parts and parts[-1] == "":
        parts = parts[:-1]
    if len(parts) != stages:
        raise ConfigError(
            f"{where}: {layout!r} has {len(parts)} stages, expected {stages} (pp x vp; 2 pp for "
            "dualpipev)"
        )
    n = sum(p.count("t") for p in parts)
    if n != layers:
        raise ConfigError(f"{where}: {layout!r} places {n} layers, the model has {layers}")
    return parts


def even(
    stages: int, layers: int, embedding: bool = False, loss: bool = False, where: str = "layout"
) -> list[str]:
    """The even split as layout symbols per virtual stage."""
    seq = (["E"] if embedding else []) + ["t"] * layers + (["L"] if loss else [])
    if len(seq) < stages:
        raise ConfigError(
            f"{where}: pp x vp = {stages} virtual stages exceed the model's {len(seq)} layers"
            + (" (counting the embedding and the loss)" if embedding or loss else "")
        )
    q, r = divmod(len(seq), stages)
    out, start = [], 0
    for v in range(stages):
        k = q + (1 if v < r else 0)
        out.append("".join(seq[start : start + k]))
        start += k
    if not embedding:
        out[0] = "E" + out[0]
    if not loss:
        out[-1] = out[-1] + "mL"
    elif "m" not in "".join(out):
        out[-1] = out[-1].replace("L", "mL")
    return out
