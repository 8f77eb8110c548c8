"""Every HTML page is self-contained: plotly.js embedded once, nothing fetched, every axis
titled; and in headless Chromium with networking off, the plots render (skipped where
`chromium` is absent)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sim.analysis.html import check_axes, markdown, render, write_page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def bar(**layout):
    import plotly.graph_objects as go

    fig = go.Figure([go.Bar(x=["a", "b"], y=[1.0, 2.0])])
    fig.update_layout(**layout)
    return fig


def test_plotly_js_once_and_no_remote_scripts(tmp_path):
    figs = [bar(xaxis_title="strategy", yaxis_title="time (ms)") for _ in range(3)]
    page = write_page(tmp_path / "p.html", "three <charts>", [*figs, "# notes\n\n- a `b`"])
    html = page.read_text()
    # booleans, not string comparisons: pytest would diff the 4 MB page on a failure
    once, remote = html.count("* plotly.js v") == 1, '<script src="http' in html
    assert once and not remote
    assert "<title>three &lt;charts&gt;</title>" in html
    assert html.count('class="plotly-graph-div"') == 3
    assert "<li>a <code>b</code></li>" in html
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically


def test_a_page_of_text_carries_no_plotly():
    assert "plotly.js v" not in render("t", ["just text"])


def test_axes_need_titles():
    with pytest.raises(ValueError, match="yaxis has no title"):
        check_axes(bar(xaxis_title="strategy"))
    check_axes(bar(xaxis={"visible": False}, yaxis={"visible": False}))  # a drawing


def test_markdown_tables_and_escaping():
    out = markdown("| a | b |\n|---|---:|\n| <x> | **1** |")
    assert "<th>a</th>" in out and "<td>&lt;x&gt;</td>" in out and "<strong>1</strong>" in out
    assert "---" not in out


def pages(tmp: Path) -> dict[str, Path]:
    """One page of every kind moesim writes, each small and without torch."""
    from sim.analysis.draw import draw_topology
    from sim.analysis.report import build
    from sim.analysis.report import write as write_report
    from sim.analysis.validate import write_report as write_validation
    from sim.commands import compare_strategies as compare
    from sim.hardware.topology import Topology
    from tests.test_compare import CFG

    out = {"topology": draw_topology(Topology.load("dgx-a100", nodes=2), tmp / "topo.html")}
    res = compare(CFG, ["sequential", "pipelined:degree=2"], tmp / "cmp")
    out["compare"] = res.files["html"]
    out["report"] = write_report(build([str(tmp / "cmp")]), tmp / "rep", timelines=1)["html"]
    runs = [
        {
            "graph": g,
            "measured_s": m,
            "simulated_s": s,
            "error_pct": 100 * (s / m - 1),
            "tasks_matched": 1,
            "per_kind": {},
        }
        for g, m, s in (("sequential fwd", 0.010, 0.011), ("pipelined r=2 fwd", 0.008, 0.0079))
    ]
    out["validate"] = write_validation(runs, tmp / "val", "validation")["html"]
    return out


@pytest.mark.slow  # four browser launches: about 10 s on an idle 2-core machine
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_pages_render_offline_in_headless_chromium(tmp_path):
    for kind, page in pages(tmp_path).items():
        html = page.read_text()
        once, remote = html.count("* plotly.js v") == 1, '<script src="http' in html
        assert once and not remote, kind
        dom = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                # networking off: every name resolves to nothing, every proxy is dead
                "--host-resolver-rules=MAP * ~NOTFOUND",
                "--proxy-server=http://127.0.0.1:9",
                f"--user-data-dir={tmp_path / 'profile'}",
                "--virtual-time-budget=3000",
                "--dump-dom",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        # drawn by plotly.js: its SVG root and at least one trace's marks, not just the div
        svg, marks = 'class="main-svg"' in dom, ('class="point"' in dom or "js-line" in dom)
        assert svg and marks, f"{kind}: no plot drawn"
