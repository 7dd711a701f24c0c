"""The content of a report: a header (title, subtitle, key/value lines) and sections of blocks.

This module only collects content; `gem.report.html` renders it and `gem.report.publish` publishes
it under a local folder or an object store prefix (gem.storage).
Figures are rendered to PNG bytes when they are added (and closed then), so a report that collects
many figures never keeps their matplotlib objects alive.

    report = Report(title="GEM quality study", subtitle="preset small, 3 seeds")
    report.meta(key="commit", value="<commit>")
    sec = report.section("Matched compute", intro="...")
    sec.table(rows, formats={"ne": "{:.4f}"})
    sec.figure(fig, name="ne_by_arch")
    sec.claim("Kunlun beats DLRM", "reproduced", "NE 0.812 vs 0.829, 95% CI of the gap excludes 0")
    index_html = report.write("out/quality")  # or "s3://bucket/lake/_reports/..."
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.figure
import matplotlib.pyplot as plt

from gem import storage
from gem.report.blocks import Block, Claim, ClaimStatus, Figure, Paragraph, Table
from gem.report.html import render_html
from gem.report.publish import publish_folder

# A figure name becomes img/<name>.png: letters, digits, '.', '_', '-', starting with a letter or
# digit (so never '.', '..' or a hidden file), no path separators.
_FIGURE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@dataclass
class Section:
    """One titled part of a report: its blocks render in the order they were added."""

    title: str
    intro: str = ""
    blocks: list[Block] = field(default_factory=list)
    # The report's names in use, shared by all its sections: two figures may not share a file.
    _figure_names: set[str] = field(default_factory=set, repr=False)

    def paragraph(self, text: str) -> None:
        """Plain text (HTML-escaped when rendered)."""
        self.blocks.append(Paragraph(str(text)))

    def table(
        self,
        rows: list[dict[str, object]],
        columns: list[str] | None = None,
        caption: str = "",
        formats: dict[str, str] | None = None,
    ) -> None:
        """A table of `rows`; `columns` defaults to every key in order of first appearance.

        `formats` maps a column to a `str.format` pattern such as "{:.4f}"; a column without one
        shows ints as is and floats with 6 significant digits. Numbers are right-aligned.
        """
        if columns is None:
            columns = list(dict.fromkeys(key for row in rows for key in row))
        formats = dict(formats or {})
        unknown = sorted(set(formats) - set(columns))
        if unknown:
            raise ValueError(f"formats name columns the table does not show: {unknown}")
        self.blocks.append(Table([dict(r) for r in rows], list(columns), str(caption), formats))

    def figure(self, fig: matplotlib.figure.Figure, name: str, caption: str = "") -> None:
        """Render `fig` now as img/<name>.png and close it. `name` must be a safe file name."""
        if not isinstance(name, str) or not _FIGURE_NAME.fullmatch(name):
            raise ValueError(
                f"figure name {name!r} is not a safe file name: use 1-100 letters, digits, '.', '_' "
                "or '-', starting with a letter or digit"
            )
        if name in self._figure_names:
            raise ValueError(f"figure name {name!r} is already used in this report")
        buffer = io.BytesIO()
        # savefig renders through Agg for PNG whatever backend the figure was made under: no display.
        fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
        plt.close(fig)  # frees a pyplot-managed figure; a no-op for one built with Figure() directly
        self._figure_names.add(name)
        self.blocks.append(Figure(name, buffer.getvalue(), str(caption)))

    def claim(self, name: str, status: ClaimStatus | str, detail: str) -> None:
        """A verdict row: `status` is 'reproduced', 'not reproduced' or 'inconclusive'."""
        self.blocks.append(Claim(str(name), ClaimStatus.parse(status), str(detail)))


@dataclass
class Report:
    """A report: title, optional subtitle, header key/values, and sections in order."""

    title: str
    subtitle: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    sections: list[Section] = field(default_factory=list)
    _figure_names: set[str] = field(default_factory=set, repr=False)

    def meta(self, key: str, value: object) -> None:
        """A key/value line in the header (commit, preset, date...); setting a key again replaces it."""
        self.metadata[str(key)] = str(value)

    def section(self, title: str, intro: str = "") -> Section:
        """Append a new section and return it."""
        sec = Section(str(title), str(intro), _figure_names=self._figure_names)
        self.sections.append(sec)
        return sec

    def claims(self) -> list[Claim]:
        """Every claim of the report, in order."""
        return [b for sec in self.sections for b in sec.blocks if isinstance(b, Claim)]

    def write(self, out_dir: str | Path) -> str:
        """Publish out_dir/index.html and out_dir/img/<name>.png, replacing any report there.

        `out_dir` is a local folder or an object store prefix; the report is built aside and
        published whole (gem.report.publish), so a reader never sees a half-written report.
        Returns the URI of index.html (a plain path on a local disk).
        """
        files = {"index.html": render_html(self).encode("utf-8")}
        for sec in self.sections:
            for block in sec.blocks:
                if isinstance(block, Figure):
                    files[f"img/{block.name}.png"] = block.png
        return storage.join(publish_folder(out_dir, files), "index.html")
