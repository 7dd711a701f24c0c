"""Render a Report as one self-contained HTML page.

Offline by construction: the CSS is inline, fonts are the system's, there is no JavaScript, and
figures are referenced by relative paths (img/<name>.png) so the folder can be moved or served
as is. Every piece of caller text goes through `html.escape`.
"""

from __future__ import annotations

import html
import numbers
from collections import Counter
from typing import TYPE_CHECKING

from gem.report.blocks import Block, Claim, ClaimStatus, Figure, Link, Paragraph, Table

if TYPE_CHECKING:  # report.py imports this module to write itself
    from gem.report.report import Report

_CSS = """
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       margin: 2rem auto; max-width: 72rem; padding: 0 1rem; color: #1f2328; line-height: 1.45; }
header { border-bottom: 1px solid #d0d7de; margin-bottom: 1.5rem; padding-bottom: 1rem; }
h1 { margin: 0 0 .25rem; font-size: 1.8rem; }
.subtitle { margin: 0 0 .75rem; color: #57606a; font-size: 1.1rem; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: .15rem 1rem; margin: .5rem 0;
          font-size: .9rem; }
dl.meta dt { color: #57606a; }
dl.meta dd { margin: 0; font-family: ui-monospace, "DejaVu Sans Mono", monospace; word-break: break-all; }
nav ol { margin: .5rem 0 0; padding-left: 1.5rem; }
section { margin: 0 0 2.5rem; }
section > p { white-space: pre-line; }  /* a paragraph's own line breaks show */
h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .25rem; font-size: 1.35rem; }
table { border-collapse: collapse; margin: 1rem 0; font-size: .9rem; }
caption { caption-side: top; text-align: left; color: #57606a; padding-bottom: .35rem; }
th, td { border: 1px solid #d0d7de; padding: .3rem .6rem; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eaeef2; }
figcaption { color: #57606a; font-size: .9rem; margin-top: .35rem; }
.claim { display: flex; gap: .75rem; align-items: baseline; padding: .45rem .6rem; margin: .4rem 0;
         border: 1px solid #d0d7de; border-radius: 6px; }
.claim .name { font-weight: 600; }
.claim .detail { color: #424a53; }
.badge { display: inline-block; white-space: nowrap; border-radius: 999px; padding: .05rem .6rem;
         font-size: .8rem; font-weight: 600; color: #fff; }
.badge.reproduced { background: #1a7f37; }
.badge.not-reproduced { background: #cf222e; }
.badge.inconclusive { background: #9a6700; }
.summary { margin: .5rem 0 0; }
.summary .badge { margin-right: .4rem; }
"""


def _e(text: object) -> str:
    """HTML-escaped text, quotes included (safe in attributes too)."""
    return html.escape(str(text), quote=True)


def _is_number(value: object) -> bool:
    # bool is an Integral, but True/False are labels, not quantities to right-align.
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def format_cell(value: object, pattern: str | None) -> str:
    """A cell's text: `pattern` (str.format) when given, ints as is, other reals to 6 significant
    digits, None as an empty cell."""
    if value is None:
        return ""
    if pattern is not None:
        return pattern.format(value)
    if isinstance(value, numbers.Integral) or not _is_number(value):
        return str(value)
    return f"{float(value):.6g}"


def _badge(status: ClaimStatus) -> str:
    return f'<span class="badge {status.value.replace(" ", "-")}">{_e(status.value)}</span>'


def _table(block: Table) -> str:
    out = ["<table>"]
    if block.caption:
        out.append(f"<caption>{_e(block.caption)}</caption>")
    out.append("<thead><tr>" + "".join(f"<th>{_e(c)}</th>" for c in block.columns) + "</tr></thead>")
    out.append("<tbody>")
    for row in block.rows:
        cells = []
        for column in block.columns:
            value = row.get(column)
            if isinstance(value, Link):
                cells.append(f'<td><a href="{_e(value.href)}">{_e(value.text)}</a></td>')
                continue
            css = ' class="num"' if _is_number(value) else ""
            cells.append(f"<td{css}>{_e(format_cell(value, block.formats.get(column)))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _block(block: Block) -> str:
    if isinstance(block, Paragraph):
        return f"<p>{_e(block.text)}</p>"
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Figure):
        alt = block.caption or block.name
        caption = f"<figcaption>{_e(block.caption)}</figcaption>" if block.caption else ""
        return f'<figure><img src="img/{_e(block.name)}.png" alt="{_e(alt)}">{caption}</figure>'
    if isinstance(block, Claim):
        return (
            f'<div class="claim">{_badge(block.status)}<span class="name">{_e(block.name)}</span>'
            f'<span class="detail">{_e(block.detail)}</span></div>'
        )
    raise TypeError(f"unknown report block {type(block).__name__}")


def _header(report: Report) -> str:
    out = ["<header>", f"<h1>{_e(report.title)}</h1>"]
    if report.subtitle:
        out.append(f'<p class="subtitle">{_e(report.subtitle)}</p>')
    if report.metadata:
        items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in report.metadata.items())
        out.append(f'<dl class="meta">{items}</dl>')
    counts = Counter(claim.status for claim in report.claims())
    if counts:
        badges = "".join(f"{_badge(s)}{counts[s]} " for s in ClaimStatus if counts[s])
        out.append(f'<p class="summary">Claims: {badges}</p>')
    if len(report.sections) > 1:
        links = "".join(f'<li><a href="#s{i}">{_e(s.title)}</a></li>' for i, s in enumerate(report.sections, 1))
        out.append(f"<nav><ol>{links}</ol></nav>")
    out.append("</header>")
    return "\n".join(out)


def render_html(report: Report) -> str:
    """The page of `report` as a string (figures are referenced, not embedded)."""
    body = [_header(report)]
    for i, sec in enumerate(report.sections, 1):
        body.append(f'<section id="s{i}">\n<h2>{_e(sec.title)}</h2>')
        if sec.intro:
            body.append(f"<p>{_e(sec.intro)}</p>")
        body.extend(_block(b) for b in sec.blocks)
        body.append("</section>")
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(report.title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )
