"""HTML reports with matplotlib figures that render offline (studies, per-day runs, distillation).

    from gem.report import Report
    report = Report(title="GEM quality study", subtitle="preset small, 3 seeds")
    report.meta(key="commit", value="<commit>")
    sec = report.section("Matched compute", intro="...")
    sec.table(rows, formats={"ne": "{:.4f}"}); sec.figure(fig, name="ne"); sec.claim(name, "reproduced", detail)
    report.write(out_dir)  # -> out_dir/index.html, out_dir/img/ne.png

`report.py` collects content, `blocks.py` holds its block types, `html.py` renders the page,
`publish.py` writes the folder atomically, `plots.py` draws the common plot kinds.
"""

from gem.report.blocks import ClaimStatus, Link
from gem.report.report import Report, Section

__all__ = ["ClaimStatus", "Link", "Report", "Section"]
