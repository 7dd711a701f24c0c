"""gem.report: the page renders in a real browser (headless Chromium), with its figures loaded,
text escaped, and a rewrite replacing the old report; the plot helpers draw what they fit."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from gem.report import ClaimStatus, Report
from gem.report.html import render_html
from gem.report.plots import interval_bars, scatter_with_fit
from tests.browser import render

ROWS = [
    {"arch": "kunlun", "ne": 0.812345, "auc": 0.7712, "steps": 1200},
    {"arch": "dlrm", "ne": 0.829871, "auc": 0.7551, "steps": 1200},
]


def _study(title: str = "GEM quality study", figure_names: tuple[str, str] = ("ne_by_arch", "scaling")) -> Report:
    report = Report(title=title, subtitle="preset small, 3 seeds")
    report.meta(key="commit", value="af6e102")
    sec = report.section("Matched compute", intro="Every architecture trains for the same FLOPs.")
    sec.table(ROWS, caption="Held-out metrics", formats={"ne": "{:.4f}"})
    sec.figure(interval_bars({"kunlun": (0.8123, 0.8101, 0.8150), "dlrm": (0.8299, 0.8270, 0.8321)}), figure_names[0])
    fig, ax = plt.subplots()  # a pyplot figure: the report must close it
    ax.plot([1, 2, 3], [0.83, 0.82, 0.815])
    sec.figure(fig, figure_names[1], caption="NE against compute")
    assert not plt.fignum_exists(fig.number)
    sec.claim("Kunlun beats DLRM at matched compute", "reproduced", "gap 0.0176, 95% CI [0.012, 0.022]")
    return report


def test_report_renders_in_chromium_with_its_figures_and_escaped_text(tmp_path: Path):
    report = _study(title="GEM <quality> & study")
    report.section("Notes").paragraph("<b>not bold</b> <script>document.title='hacked'</script>")
    index = report.write(tmp_path / "study")
    assert index == str(tmp_path / "study" / "index.html")

    page = render(index)
    assert page.title == "GEM <quality> & study"  # the script, had it run, would have renamed it
    assert "<b>not bold</b> <script>document.title='hacked'</script>" in page.text
    assert "Matched compute" in page.text and "preset small, 3 seeds" in page.text and "af6e102" in page.text
    # The table as rendered: formats applied (ne to 4 decimals), unformatted floats to 6 digits.
    assert "kunlun\t0.8123\t0.7712\t1200" in page.text
    assert "dlrm\t0.8299\t0.7551\t1200" in page.text
    assert "reproduced" in page.text and "Kunlun beats DLRM at matched compute" in page.text
    assert [(img.src, img.loaded) for img in page.images] == [("img/ne_by_arch.png", True), ("img/scaling.png", True)]

    # The check can fail: a figure whose file is gone renders as not loaded, the other still loads.
    (tmp_path / "study" / "img" / "scaling.png").unlink()
    page = render(index)
    assert [(img.src, img.loaded) for img in page.images] == [("img/ne_by_arch.png", True), ("img/scaling.png", False)]


def test_rewrite_replaces_the_old_report_and_leaves_no_staging(tmp_path: Path):
    out = tmp_path / "daily"
    _study(title="run of 2026-01-01", figure_names=("old_a", "old_b")).write(out)
    (out / "stray.txt").write_text("from the old report")
    _study(title="run of 2026-01-02", figure_names=("new_a", "new_b")).write(out)

    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "img",
        "img/new_a.png",
        "img/new_b.png",
        "index.html",
    ]
    text = (out / "index.html").read_text()
    assert "run of 2026-01-02" in text and "2026-01-01" not in text
    assert (out / "img" / "new_a.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert [p.name for p in tmp_path.iterdir()] == ["daily"]  # staging and retired folders removed


def test_write_refuses_to_replace_a_folder_that_is_not_a_report(tmp_path: Path):
    (tmp_path / "keep.txt").write_text("not a report")
    with pytest.raises(FileExistsError, match="not a report folder"):
        Report(title="t").write(tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "not a report"


@pytest.mark.parametrize("name", ["", "../up", "a/b", ".hidden", "with space", "x" * 101, "é"])
def test_unsafe_figure_names_are_rejected(name: str):
    sec = Report(title="t").section("s")
    fig, _ = plt.subplots()
    with pytest.raises(ValueError, match="not a safe file name"):
        sec.figure(fig, name)
    plt.close(fig)


def test_a_figure_name_is_used_once_per_report():
    report = Report(title="t")
    report.section("a").figure(plt.figure(), "curve")
    with pytest.raises(ValueError, match="already used"):
        report.section("b").figure(plt.figure(), "curve")
    plt.close("all")


def test_claim_status_and_table_formats_are_checked():
    sec = Report(title="t").section("s")
    with pytest.raises(ValueError, match="not one of 'reproduced', 'not reproduced', 'inconclusive'"):
        sec.claim("c", "reproducible", "")
    with pytest.raises(ValueError, match=r"\['nee'\]"):
        sec.table(ROWS, formats={"nee": "{:.4f}"})
    sec.claim("c", ClaimStatus.NOT_REPRODUCED, "d")
    assert sec.blocks[-1].status is ClaimStatus.NOT_REPRODUCED


def test_numbers_are_right_aligned_and_missing_cells_empty():
    report = Report(title="t")
    report.section("s").table([{"a": "x", "n": np.float32(0.5), "flag": True}, {"a": "y"}], columns=["a", "n", "flag"])
    page = render_html(report)
    assert '<td>x</td><td class="num">0.5</td><td>True</td>' in page  # bool is a label, not a number
    assert "<td>y</td><td></td><td></td>" in page
    assert "http://" not in page and "https://" not in page  # nothing fetched from elsewhere


def test_scatter_with_fit_recovers_the_line_it_draws():
    x = np.array([1e3, 1e4, 1e5, 1e6])
    _, (slope, intercept) = scatter_with_fit(x, 0.9 - 0.02 * np.log10(x), logx=True)
    assert slope == pytest.approx(-0.02) and intercept == pytest.approx(0.9)
    fig, (slope, intercept) = scatter_with_fit([0, 1, 2], [1, 3, 5], connect=True)
    assert (slope, intercept) == pytest.approx((2.0, 1.0))
    assert len(fig.axes[0].lines) == 2  # the points and the fitted line
    with pytest.raises(ValueError, match="2 distinct x"):
        scatter_with_fit([1, 1], [2, 3])


def test_interval_bars_draw_the_intervals_given():
    fig = interval_bars({"a": (1.0, 0.9, 1.2), "b": (2.0, 1.5, 2.1)}, reference=1.5)
    ax = fig.axes[0]
    assert [p.get_height() for p in ax.patches] == [1.0, 2.0]
    low, high = ax.get_ylim()
    assert low < 0.9 and high > 2.1  # every interval is inside the axis
    with pytest.raises(ValueError, match="lo <= mean <= hi"):
        interval_bars({"a": (1.0, 1.1, 1.2)})
