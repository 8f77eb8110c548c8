"""The README's examples run as written: every `moesim ...` line of its shell blocks, in order,
in a scratch directory where `my.yaml` is the demo config and `cal.yaml` a recorded
calibration (files an example writes, such as `g.json`, are there for the next ones); and the
"From Python" block executed verbatim.

The simulator's examples run in the default suite; the executor's (real gloo processes,
minutes of calibration on a 2-core machine) are marked slow, and lines that need NCCL GPUs
are skipped with that reason.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from sim.cli import main
from tests.configs import SMALL

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CALIBRATION = ROOT / "reports" / "validation-localhost-gloo" / "calibration.yaml"
EXEC_COMMANDS = ("exec", "calibrate", "validate")

# Lines allowed to fail until another change lands, with the reason. They still run; one
# that passes is fine (delete its entry then), so the list does not break a merge.
EXPECTED_FAILURES: dict[str, str] = {}


def shell_blocks(text: str) -> list[str]:
    """The bodies of the ```sh blocks."""
    return re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M)


def commands(text: str) -> list[str]:
    """Every command line of the shell blocks that starts with `moesim` or `torchrun`, with
    `\\` continuations joined and comments dropped."""
    out = []
    for block in shell_blocks(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] in ("moesim", "torchrun"):
                out.append(shlex.join(words))
    return out


def python_block(text: str) -> str:
    """The ```python block under the "From Python" heading."""
    part = text.split("## From Python", 1)[1]
    return re.search(r"^```python\n(.*?)^```", part, flags=re.S | re.M).group(1)


def _is_exec(cmd: str) -> bool:
    """An executor example: `moesim exec|calibrate|validate ...`, or torchrun."""
    words = cmd.split()
    return words[0] == "torchrun" or words[1] in EXEC_COMMANDS


def _needs_gpus(cmd: str) -> bool:
    return cmd.startswith("torchrun") or "--backend nccl" in cmd


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A directory laid out as a user's: my.yaml, cal.yaml, and the repository's traces,
    benchmarks and topologies beside them."""
    from sim import commands

    shutil.copy(ROOT / "sim" / "configs" / "demo.yaml", tmp_path / "my.yaml")
    shutil.copy(CALIBRATION, tmp_path / "cal.yaml")
    for name in ("traces", "benchmarks", "topologies", "sim"):
        (tmp_path / name).symlink_to(ROOT / name)
    _results(tmp_path / "old.parquet", 1.0)  # `moesim report new --baseline old`: 2% slower
    _results(tmp_path / "new.parquet", 1.02)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MOESIM_PROGRESS", "0")
    assert commands.load_config("my.yaml").strategy  # the copy is a valid config
    return tmp_path


def _results(path: Path, scale: float) -> None:
    """A sweep's results table (the shared row schema) of two strategies on one config."""
    import pandas as pd

    rows = [
        {
            "run_id": f"r{i}",
            "config": "topology=dgx-a100,nodes=2",
            "strategy": s,
            "status": "ok",
            "error": "",
            "makespan_s": t * scale,
            "time_per_token_s": t * scale / 8192,
            "tokens": 8192,
            "gpus": 16,
        }
        for i, (s, t) in enumerate((("sequential", 0.013), ("pipelined:degree=4", 0.0104)))
    ]
    pd.DataFrame(rows).to_parquet(path)


def _run(cmd: str) -> tuple[int, str]:
    words = shlex.split(cmd)
    assert words[0] == "moesim", cmd
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            rc = main(words[1:])
        except SystemExit as e:  # argparse
            rc = e.code if isinstance(e.code, int) else 1
    return rc, out.getvalue()


def _check(cmds: list[str]) -> None:
    failed = []
    for cmd in cmds:
        rc, out = _run(cmd)
        if rc != 0 and cmd not in EXPECTED_FAILURES:
            failed.append(f"{cmd}\n  exit {rc}: {out.strip().splitlines()[-1:]}")
    assert not failed, "README examples that fail:\n" + "\n".join(failed)


def test_readme_has_the_examples():
    cmds = commands(README.read_text())
    assert any(c.startswith("moesim simulate") for c in cmds)
    assert any(_is_exec(c) for c in cmds)


def test_simulator_examples_run_as_written(scratch):
    cmds = [c for c in commands(README.read_text()) if not _is_exec(c)]
    # a Dask scheduler is the user's (the same sweep on a LocalCluster: test_sweep_resume)
    _check([c for c in cmds if "--scheduler" not in c])
    assert (scratch / "g.json").is_file() and (scratch / "topo.html").is_file()
    assert (scratch / "out" / "sweep" / "results.parquet").is_file()


def config_block(text: str) -> str:
    """The ```yaml run-config block that every field of a config is shown in."""
    return re.findall(r"^```yaml\n(.*?)^```", text, flags=re.S | re.M)[0]


def test_config_block_runs_as_written(scratch):
    """The README's run config, as shown (its `cal.yaml` is the scratch directory's): it
    simulates, and writes its output set where its `output.dir` says."""
    (scratch / "run.yaml").write_text(config_block(README.read_text()))
    rc, out = _run("moesim simulate run.yaml --json")
    assert rc == 0, out.strip().splitlines()[-3:]
    assert (scratch / "out" / "summary.json").is_file()


@pytest.mark.slow
def test_executor_examples_run_as_written(scratch):
    pytest.importorskip("torch")
    cmds = [c for c in commands(README.read_text()) if _is_exec(c)]
    needs_gpus = [c for c in cmds if _needs_gpus(c)]
    # the demo's layer (4,096 tokens x 2,048 x 8,192 per GPU) takes minutes on a CPU
    (scratch / "my.yaml").write_text(yaml.safe_dump(SMALL, sort_keys=False))
    # the executor runs the graph the simulator examples wrote
    _run("moesim graph my.yaml -o g.json")
    _check([c for c in cmds if c not in needs_gpus])
    if needs_gpus and not shutil.which("nvidia-smi"):
        pytest.skip(f"{len(needs_gpus)} example(s) need NCCL GPUs: {needs_gpus}")
    _check(needs_gpus)


def test_python_example_runs_verbatim(scratch):
    # a small layer (the README's own numbers do not matter to it)
    (scratch / "my.yaml").write_text(yaml.safe_dump(SMALL, sort_keys=False))
    code = python_block(README.read_text())
    assert "import sim" in code
    namespace: dict = {}
    exec(compile(code, "README.md (From Python)", "exec"), namespace)


def test_command_extraction():
    text = (
        "```sh\nmoesim simulate my.yaml --json   # a comment\n"
        "moesim whatif my.yaml --set 'link.*.bw=*2' \\\n    --set compute.speed=*0.5\n"
        "python3 -m venv .venv\n```\n```yaml\nmoesim: not a command\n```\n"
    )
    assert commands(text) == [
        "moesim simulate my.yaml --json",
        "moesim whatif my.yaml --set 'link.*.bw=*2' --set 'compute.speed=*0.5'",
    ]
    assert os.path.basename(README) == "README.md"
