"""Transcribe the held-out table (benchmarks/heldout/megatron_bridge_later.csv) from a local
git mirror of NVIDIA-NeMo/Megatron-Bridge: every pre-training row for DGX-H100 / DGX-B200 /
DGX-GB200 of a model `sim.training.predict.MODELS` knows, from the releases after those in
shared/reference/published-runs/megatron_bridge_perf.csv (26.04 ... 26.08), each at the
latest revision of its table (the snapshot's HEAD), with the commit that last set it.

    python benchmarks/heldout/extract_tables.py [--git-dir DIR] [--check]

`--check` compares the CSV on disk with a fresh transcription (no writing).
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sim.training.predict import MEASURED, REQUIRED  # noqa: E402

OUT = Path(__file__).with_name("megatron_bridge_later.csv")
GIT_DIR = "/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo"
HEAD = "067f987df03b8355b03192d88d70f1709fedf51a"  # snapshot of 2026-08-22
FILES = ("docs/performance-summary.md", "docs/performance-summary-archive.md")
RELEASES = ("26.08", "26.06.01", "26.06", "26.04.01", "26.04")
# commits of docs/performance-summary*.md that wrote each release's table, oldest first
# (`git log -- docs/performance-summary.md docs/performance-summary-archive.md`)
REVISIONS = {
    "26.04": ("74695a06d", "17a381f95"),
    "26.04.01": ("21d102f5e",),
    "26.06": ("63b08b397", "c270efc50", "8f341b04f"),
    "26.06.01": ("381d0b825",),
    "26.08": ("4ab94dfad",),
}
SYSTEMS = ("DGX-H100", "DGX-B200", "DGX-GB200")
# the doc's model names -> the shared CSV's (and sim.training.predict.MODELS')
MODEL_NAMES = {
    "DeepSeekV3": "DeepSeekV3",
    "GPT OSS 120B": "GPT_OSS_120B",
    "Qwen3_30B_a3B": "Qwen3_30B_A3B",
    "Qwen3_235B_a22B": "Qwen3_235B_A22B",
    "LLAMA3_8B": "LLAMA3_8B",
    "LLAMA3_70B": "LLAMA3_70B",
    "LLAMA3.1_405B": "LLAMA3.1_405B",
}
# the shared CSV's columns (`moesim predict`'s required ones in its order) and the source
COLUMNS = [
    "release",
    *REQUIRED[:2],
    "variant",
    *REQUIRED[2:],
    MEASURED,
    "model_tflops_per_gpu",
    "alt_tokens_per_s_per_gpu",
    "alt_note",
    "source",
]
DOC = {  # the doc's column headers -> ours
    "System": "system",
    "Model": "model",
    "#-GPUs": "gpus",
    "Precision": "precision",
    "GBS": "gbs",
    "MBS": "mbs",
    "Sequence Length": "seq_len",
    "FSDP": "fsdp",
    "TP": "tp",
    "PP": "pp",
    "CP": "cp",
    "VP": "vp",
    "EP": "ep",
    "GA": "ga",
    "Tokens / sec / GPU": "tokens_per_s_per_gpu",
    "Model TFLOP / sec / GPU": "model_tflops_per_gpu",
}


def show(git_dir: str, commit: str, path: str) -> str:
    res = subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"{commit}:{path}"],
        capture_output=True,
        text=True,
    )
    return res.stdout if res.returncode == 0 else ""


def sections(text: str) -> dict[str, str]:
    """'## <release> NeMo Container' -> its text."""
    out: dict[str, str] = {}
    parts = re.split(r"^## (\S+) NeMo Container\s*$", text, flags=re.M)
    for rel, body in zip(parts[1::2], parts[2::2]):
        out[rel] = body.split("\n## ")[0]
    return out


def pretrain_rows(body: str) -> list[dict[str, str]]:
    """The rows of a release's '### Pre-Training Performance' tables (grouped by model or by
    system), as {our column: cell}; fine-tuning (SFT, LoRA) sections are left out."""
    m = re.search(r"^### Pre-Training Performance\s*$(.*?)(?=^### |\Z)", body, flags=re.M | re.S)
    if not m:
        return []
    rows: list[dict[str, str]] = []
    group: dict[str, str] = {}
    header: list[str] = []
    for line in m.group(1).splitlines():
        g = re.match(r"^#### (Model|System): (.+?)\s*$", line)
        if g:
            group = {g.group(1).lower(): g.group(2)}
            header = []
            continue
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not header:
            header = [DOC[c] for c in cells]
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        row = dict(group)
        row.update(zip(header, cells))
        rows.append(row)
    return rows


def cell(raw: str) -> str:
    """'n/a' -> empty; footnote markers dropped."""
    raw = re.sub(r"\[\^[^\]]*\]", "", raw).strip()
    return "" if raw.lower() in ("n/a", "na", "-") else raw


def table_at(git_dir: str, commit: str) -> dict[str, tuple[str, list[dict[str, str]]]]:
    """release -> (file, pre-training rows) in the docs at `commit`."""
    out: dict[str, tuple[str, list[dict[str, str]]]] = {}
    for path in FILES:
        for rel, body in sections(show(git_dir, commit, path)).items():
            out.setdefault(rel, (path, pretrain_rows(body)))
    return out


def transcribe(git_dir: str) -> tuple[list[dict[str, str]], list[str]]:
    """The held-out rows and one line per row left out (with why)."""
    head = table_at(git_dir, HEAD)
    rows: list[dict[str, str]] = []
    skipped: list[str] = []
    history = {c: table_at(git_dir, c) for cs in REVISIONS.values() for c in cs}
    for rel in RELEASES:
        path, latest = head[rel]
        for r in latest:
            model = r["model"]
            label = f"{rel} {r['system']} {model} {r['precision']} {r['gpus']} GPUs"
            if r["system"] not in SYSTEMS:
                skipped.append(f"{label}: system without a preset")
                continue
            if model not in MODEL_NAMES:
                skipped.append(f"{label}: model not in sim.training.predict.MODELS")
                continue
            # the first revision of this release's table that printed the row as it is now
            first = next((c for c in REVISIONS[rel] if r in history[c].get(rel, ("", []))[1]), None)
            out = {k: "" for k in COLUMNS}
            out.update({k: cell(v) for k, v in r.items() if k in COLUMNS})
            out["release"], out["model"] = rel, MODEL_NAMES[model]
            out["fsdp"] = out["fsdp"] or "0"  # tables without the column: DDP (recipes say so)
            notes = sorted(set(re.findall(r"\[\^([^\]]*)\]", " ".join(r.values()))))
            out["source"] = (
                f"Megatron-Bridge {HEAD[:9]}:{path} '{rel} NeMo Container'"
                + (f", as first printed in {first}" if first else "")
                + "".join(f"; footnote {n}" for n in notes)
            )
            rows.append(out)
    return rows, skipped


def render(rows: list[dict[str, str]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--git-dir", default=GIT_DIR)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    rows, skipped = transcribe(a.git_dir)
    text = render(rows)
    if a.check:
        same = OUT.exists() and OUT.read_text() == text
        print("same" if same else "differs")
        sys.exit(0 if same else 1)
    OUT.write_text(text)
    print(f"{len(rows)} rows -> {OUT.relative_to(ROOT)}; {len(skipped)} left out:")
    for s in skipped:
        print("  " + s)


if __name__ == "__main__":
    main()
