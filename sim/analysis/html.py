"""One writer for every HTML page moesim produces: self-contained, readable offline.

A page is a title and a list of blocks: plotly figures, pandas tables, and short Markdown-ish
text (headings, bullets, pipe tables, `code`). plotly.js is embedded once in the page's head
(no CDN: an air-gapped cluster or a laptop on a train shows the same page), each figure is a
div drawn by it. Every visible axis of every figure must carry a title (with its unit), so the
writer refuses a figure without one rather than ship an unlabelled chart.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from sim.core.io import OutputSet, atomic_write_text

Block = Any  # a plotly Figure, a pandas DataFrame, or Markdown-ish text (str)


def render(title: str, blocks: list[Block]) -> str:
    """The page as one string: head with plotly.js (once), then the blocks in order."""
    from plotly.offline import get_plotlyjs

    body = [f"<h1>{html.escape(title)}</h1>"]
    figures = 0
    for block in blocks:
        if isinstance(block, str):
            body.append(markdown(block))
        elif hasattr(block, "to_html") and hasattr(block, "layout"):  # a plotly figure
            check_axes(block)
            figures += 1
            body.append(
                block.to_html(
                    full_html=False,
                    include_plotlyjs=False,
                    div_id=f"figure-{figures}",
                    config={"responsive": True},
                )
            )
        elif hasattr(block, "to_html"):  # a DataFrame
            body.append(block.to_html(index=False, border=0, classes="table", na_rep=""))
        else:
            raise TypeError(f"html page block: unsupported {type(block).__name__}")
    # plotly.js only when a figure needs it: a page of tables stays small
    script = f'<script type="text/javascript">{get_plotlyjs()}</script>' if figures else ""
    return (
        "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n{script}\n</head>\n"
        "<body>\n" + "\n".join(body) + "\n</body>\n</html>\n"
    )


def write_page(
    where: str | Path | OutputSet, title: str, blocks: list[Block], name: str = ""
) -> Path:
    """Write the page atomically: to a path, or as file `name` of an output set."""
    text = render(title, blocks)
    if isinstance(where, OutputSet):
        return where.write_text(name, text)
    atomic_write_text(where, text)
    return Path(where)


def check_axes(fig: Any) -> None:
    """Every visible cartesian axis has a title (a chart's unit is not a guess)."""
    layout = fig.to_plotly_json().get("layout", {})
    used = {"xaxis", "yaxis"} if any(_cartesian(t) for t in fig.data) else set()
    for t in fig.data:
        if _cartesian(t):
            for ax in ("xaxis", "yaxis"):
                ref = getattr(t, ax, None) or ax[0]
                used.add(ax + ref[1:])
    for ax in sorted(used):
        spec = layout.get(ax, {})
        if spec.get("visible") is False:
            continue
        if not (spec.get("title") or {}).get("text"):
            raise ValueError(f"figure {_title(layout)!r}: {ax} has no title (name its unit)")


def _cartesian(trace: Any) -> bool:
    return trace.type in ("bar", "scatter", "scattergl", "box", "histogram", "heatmap")


def _title(layout: dict[str, Any]) -> str:
    t = layout.get("title")
    return (t or {}).get("text", "") if isinstance(t, dict) else str(t or "")


def markdown(text: str) -> str:
    """The small Markdown subset the reports write: #-headings, - bullets, pipe tables,
    paragraphs, `code` and **bold**; everything else escaped as text."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        if not line.strip():
            i += 1
        elif line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")) + 1, 6)  # page title is the <h1>
            out.append(f"<h{level}>{_inline(line.lstrip('#').strip())}</h{level}>")
            i += 1
        elif line.lstrip().startswith("- "):
            items = []
            while i < len(lines) and lines[i].lstrip().startswith("- "):
                items.append(f"<li>{_inline(lines[i].lstrip()[2:])}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(lines[i].strip().strip("|").split("|"))
                i += 1
            out.append(_table(rows))
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(("#", "|")):
                para.append(lines[i].strip())
                i += 1
            out.append(f"<p>{_inline(' '.join(para))}</p>")
    return "\n".join(out)


def _table(rows: list[list[str]]) -> str:
    head, body = rows[0], rows[1:]
    if body and all(re.fullmatch(r"\s*:?-+:?\s*", c) for c in body[0]):
        body = body[1:]  # the |---| separator line
    th = "".join(f"<th>{_inline(c.strip())}</th>" for c in head)
    trs = "".join(
        "<tr>" + "".join(f"<td>{_inline(c.strip())}</td>" for c in r) + "</tr>" for r in body
    )
    return f"<table class='table'><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def _inline(text: str) -> str:
    t = html.escape(text).replace(",", ",<wbr>")  # long key=value,... labels may wrap there
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", t)


_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222}"
    "table{border-collapse:collapse;margin:0.8em 0;max-width:100%}"
    "th,td{border:1px solid #ccc;padding:0.25em 0.6em;text-align:right;overflow-wrap:break-word}"
    "th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}"
    "code{background:#f3f3f3;padding:0 0.2em}"
)
