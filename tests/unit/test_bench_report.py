"""docs/benchmarks.md and every figure README.md and docs/ quote are what docs/benchmarks/*.json say."""

from __future__ import annotations

import json

import pytest

from bench import report
from bench.results import Figure, load_all, record


def test_the_benchmark_page_and_the_quoted_figures_match_their_results():
    stale = [str(path) for path, text in report.expected_files().items() if not path.exists() or path.read_text() != text]
    assert not stale, f"out of date with docs/benchmarks/*.json, run `python -m bench.report`: {stale}"


def test_a_recorded_result_renders_and_is_quoted(tmp_path):
    results_dir = tmp_path / "benchmarks"
    path = record("make_demo", "`make demo`", [Figure("wall_s", "make demo", 412.34, "s"),
                                                 Figure("speedup", "new / old", 1.734, "x"),
                                                 Figure("passed", "tests passed", 571)],
                  command="python -m bench.commands", results_dir=results_dir)
    stored = json.loads(path.read_text())
    assert stored["command"] == "python -m bench.commands"
    assert len(stored["commit"]) == 40 and stored["host"]["cores"] >= 1
    results = {result.name: result for result in load_all(results_dir)}
    page = report.render_page(list(results.values()))
    assert "| make demo | 412 s |" in page and "| new / old | 1.73x |" in page and "| tests passed | 571 |" in page
    text = ("takes <!-- fig make_demo.wall_s min -->1 min<!-- /fig --> and passes "
            "<!-- fig make_demo.passed -->0<!-- /fig --> tests")
    assert report.requote(text, results, "README.md") == (
        "takes <!-- fig make_demo.wall_s min -->7 min<!-- /fig --> and passes <!-- fig make_demo.passed -->571<!-- /fig --> tests")


def test_a_quote_of_a_missing_result_or_figure_names_it(tmp_path):
    results_dir = tmp_path / "benchmarks"
    record("make_demo", "`make demo`", [Figure("wall_s", "make demo", 400.0, "s")], command="x", results_dir=results_dir)
    results = {result.name: result for result in load_all(results_dir)}
    with pytest.raises(report.ReportError, match="make_test.json does not exist"):
        report.requote("<!-- fig make_test.wall_s min -->?<!-- /fig -->", results, "README.md")
    with pytest.raises(report.ReportError, match="no figure 'rows'"):
        report.requote("<!-- fig make_demo.rows -->?<!-- /fig -->", results, "docs/x.md")
    with pytest.raises(ValueError, match="repeated figure keys"):
        record("x", "x", [Figure("a", "a", 1), Figure("a", "b", 2)], command="x", results_dir=results_dir)
