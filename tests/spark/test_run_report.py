"""`gem report --ds D`: the run report of a day, built from what real stages committed, opened in
headless Chromium.

The lakehouse is the precompute tests' small one (real Delta tables written without Spark), on which
the real mix, pretraining (6 steps of a tiny Kunlun) and precompute jobs run for day 3, and Great
Expectations (real, pandas engine) validates two suites for day 3, one of them twice. The report
must show those records, results and metrics as they are stored, with every figure loaded and every
Data Docs link pointing at a page that exists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pandas as pd
import pytest
from typer.testing import CliRunner

from gem.data.delta_log import read_table
from gem.lakehouse import completions
from gem.lakehouse.commit import StageContext
from gem.lakehouse.stages import STAGES
from gem.report.run_report import build, loss_summary, promoted_losses, report_dir
from schemas.metrics import GOLD_METRICS
from schemas.precompute import GOLD_PRECOMPUTE_STATS
from tests.browser import LinkParser, render
from tests.precompute_lakehouse import build_days, precompute_config

# Precompute runs its shard tasks on the suite's local Spark session.
pytestmark = pytest.mark.usefixtures("spark")

if TYPE_CHECKING:
    from gem.config import GemConfig

QUARANTINED = {"wrong_type": 3, "stale_timestamp": 2}


def _validate_twice(cfg: GemConfig, ds: str) -> None:
    """Suite report.rules: fails its critical expectation, then (a rerun) passes; suite report.warn:
    one warning fails. Both under batch label ds."""
    import great_expectations.expectations as gxe

    from gem.quality.runner import validate

    frame = pd.DataFrame({"user_id": ["u1", "u2", None], "clicks": [0, 3, 1]})
    critical = [gxe.ExpectColumnValuesToNotBeNull(column="user_id", meta={"critical": True, "rule": "ids"})]
    validate(cfg, frame, "report.rules", critical, ds, raise_on_critical=False)
    validate(cfg, frame.dropna(), "report.rules", critical, ds, raise_on_critical=False)
    warning = [gxe.ExpectColumnValuesToBeBetween(column="clicks", min_value=0, max_value=2,
                                                 meta={"critical": False, "rule": "clicks"})]
    validate(cfg, frame, "report.warn", warning, ds, raise_on_critical=False)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from gem.train import daily
    from jobs import mix, precompute

    cfg = precompute_config(tmp_path_factory.mktemp("run_report"))
    _, days = build_days(cfg, 3)  # with stand-in records of the validations mix and precompute need
    completions.publish_completion(cfg, "ingest_events", days[2], "test", 105, 100, QUARANTINED, {})
    ctx = StageContext(cfg)
    for day in days[1:]:
        mix.run(ctx, day)
    trained = daily.run(ctx, days[2], steps=6)
    precomputed = precompute.run(ctx, days[2])
    assert trained.published and precomputed.published
    _validate_twice(cfg, days[2])
    index = build(cfg, days[2]).write(report_dir(cfg, days[2]))
    return {"cfg": cfg, "days": days, "index": index}


def test_the_report_renders_with_every_figure(lake):
    index = lake["index"]
    assert index == str(Path(report_dir(lake["cfg"], lake["days"][2]), "index.html"))
    page = render(index)
    assert page.title == f"GEM run report, ds={lake['days'][2]}"
    for section in ("Rows per stage and day", "Quarantine by reason", "Data quality", "Held-out metrics",
                    "Training loss", "Precompute", "Students"):
        assert section in page.text
    assert [img.src for img in page.images] == ["img/rows_per_stage.png", "img/quarantine.png",
                                                "img/held_out_metrics.png", "img/training_loss.png"]
    assert all(img.loaded for img in page.images), page.images


def test_rows_and_quarantine_are_the_completion_records(lake):
    cfg, days = lake["cfg"], lake["days"]
    lines = render(lake["index"]).text.splitlines()
    for stage in STAGES:  # one row per stage that records: rows written per day, '-' without a record
        if not stage.records:  # a source (generate_events): no record ever, so no row
            assert not any(line.startswith(f"{stage.name}\t") for line in lines)
            continue
        records = [completions.completion(cfg, stage.name, day) for day in days]
        cells = [str(r["rows_written"]) if r else "-" for r in records]
        assert "\t".join([stage.name, *cells]) in lines
    assert "pretrain\t-\t-\t12" in lines  # 8 tasks scored on day 3 (2 surfaces x 4), 4 label types pooled
    for reason, rows in QUARANTINED.items():
        assert "\t".join([days[2], "ingest_events", reason, str(rows), "105", "100"]) in lines
    missing = [s.name for s in STAGES if s.records and completions.completion(cfg, s.name, days[2]) is None]
    assert missing and "generate_events" not in missing and "ingest_events" not in missing
    assert f"No record for ds={days[2]}: {', '.join(missing)}." in lines


def test_data_quality_shows_the_newest_result_and_links_to_its_page(lake):
    text = render(lake["index"]).text
    # report.rules failed, then passed on the rerun: the newest result is the one shown.
    assert f"report.rules\t{lake['days'][2]}\tpassed\t1\t0\t0\tData Docs" in text
    assert f"report.warn\t{lake['days'][2]}\twarnings\t1\t0\t1\tData Docs" in text
    links = LinkParser()
    links.feed(Path(lake["index"]).read_text())
    docs = [h for h in links.hrefs if h.endswith(".html") and "data_docs" in h]
    assert len(docs) == 2
    for href in docs:
        assert (Path(lake["index"]).parent / unquote(href)).resolve().is_file(), href


def test_metrics_loss_and_precompute_are_the_stored_figures(lake):
    cfg, day = lake["cfg"], lake["days"][2]
    text = render(lake["index"]).text
    rows = read_table(GOLD_METRICS.path(cfg.lakehouse_uri)).to_pylist()
    scored = [r for r in rows if r["ne"] is not None and r["arch"] == cfg.model.arch]
    assert scored and any(r["task"].startswith("all/") for r in scored)  # label types pooled over surfaces
    for r in scored:
        head = f"{day}\t{r['task']}\t{r['examples']}\t{r['positives']:.0f}\t"
        if r["positives"] >= cfg.report.min_positives:
            assert f"{head}{r['ne']:.4f}\t" in text
        else:  # too few positives to read: no NE, and the note says why
            assert f"{head}\t" in text and f"too few positives (< {cfg.report.min_positives})" in text
    # Either way, whatever the day's positives: a bound above them all hides every figure, one of 1 shows them.
    top = max(r["positives"] for r in scored)
    for bound, shown in ((int(top) + 1, False), (1, True)):
        bounded = cfg.replace(report={"min_positives": bound})
        page = render(build(bounded, day).write(str(Path(lake["index"]).parent.parent / f"bound-{bound}"))).text
        assert all((f"{r['task']}\t{r['examples']}\t{r['positives']:.0f}\t{r['ne']:.4f}\t" in page) == shown
                   for r in scored if r["positives"] >= 1)
    version, losses = promoted_losses(cfg, day)
    assert len(losses) == 6
    assert f"{version}: 6 steps; mean loss {losses[0]:.4f} over the first 1, {losses[-1]:.4f} over the last 1." in text
    (stats,) = read_table(GOLD_PRECOMPUTE_STATS.path(cfg.lakehouse_uri), where={"ds": day}).to_pylist()
    assert f"{day}\t{stats['model_version']}\t{stats['refreshed']}\t{stats['users_total']}\t" in text


def test_the_loss_line_gives_the_means_of_the_first_and_last_tenth():
    losses = [1.0, 3.0, *[2.0] * 16, 0.5, 0.25]  # 20 steps: tenths of 2
    assert loss_summary("kunlun@d:step20", losses) == (
        "kunlun@d:step20: 20 steps; mean loss 2.0000 over the first 2, 0.3750 over the last 2.")
    assert loss_summary("v", [0.7]) == "v: 1 steps; mean loss 0.7000 over the first 1, 0.7000 over the last 1."


def test_a_day_before_training_says_what_has_not_run(lake):
    cfg, day = lake["cfg"], lake["days"][0]
    text = render(build(cfg, day).write(report_dir(cfg, day))).text
    assert f"No model of kunlun was promoted for ds={day}." in text
    assert "Precompute has not run in the window." in text
    assert "No distillation run wrote gold.metrics in the window." in text
    assert f"No suite was validated for ds={day}." in text


def test_gem_report_prints_the_path_and_refuses_a_day_nothing_ran(lake, tmp_path: Path):
    from gem.pipeline.command import app

    config = tmp_path / "config.yaml"
    config.write_text(json.dumps(lake["cfg"].to_dict()))  # JSON is valid YAML
    done = CliRunner().invoke(app, ["report", "--ds", lake["days"][2], "--config", str(config)])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == str(lake["index"])
    refused = CliRunner().invoke(app, ["report", "--ds", "2026-02-01", "--config", str(config)])
    assert refused.exit_code == 1
    assert "no stage has a completion record for ds=2026-02-01" in refused.output


def test_students_show_beside_the_fms_logged_predictions(tmp_path: Path) -> None:
    """The distill tests' lakehouse (a seeded model promoted for day 2, precompute on days 2 and 3,
    the real distill job on day 3): the report of day 3 lists each scored task's student steps, NE and AUC
    beside the no-FM baseline student's and the FM's logged ones, as gold.metrics stores them, with the
    figure loaded."""
    from gem.distill.run import FM_ARCH, student_arch
    from jobs import distill, precompute
    from tests.precompute_lakehouse import promote_model, publish_training_records

    # A small lake: every task's figures are read from its first positive, so they show.
    cfg = precompute_config(tmp_path).replace(report={"min_positives": 1})
    _, days = build_days(cfg, 3, users=60)
    promote_model(cfg, days[1])
    publish_training_records(cfg, days[2])
    for day in days[1:]:
        assert precompute.run(StageContext(cfg), day).published
    assert distill.run(StageContext(cfg), days[2]).published
    page = render(build(cfg, days[2]).write(report_dir(cfg, days[2])))
    assert "img/students.png" in [img.src for img in page.images]
    assert all(img.loaded for img in page.images), page.images
    arch = student_arch(cfg.student.variant)
    rows = [r for r in read_table(GOLD_METRICS.path(cfg.lakehouse_uri)).to_pylist() if r["ne"] is not None]
    fm = {r["task"]: r for r in rows if r["arch"] == FM_ARCH}
    baseline = {r["task"]: r for r in rows if r["arch"] == student_arch("baseline")}
    students = [r for r in rows if r["arch"] == arch]
    assert students
    bound = cfg.report.min_positives
    for r in students:
        head = f"{r['task']}\t{r['examples']}\t{r['positives']:.0f}\t{r['train_steps']}\t"
        if r["positives"] < bound:  # too few to read: no figures, and the note says why
            assert f"{head}\t" in page.text and f"too few positives (< {bound})" in page.text, r["task"]
            continue
        assert (f"{head}{r['ne']:.4f}\t{r['auc']:.4f}\t"
                f"{baseline[r['task']]['ne']:.4f}\t{baseline[r['task']]['auc']:.4f}\t"
                f"{fm[r['task']]['ne']:.4f}\t" in page.text), r["task"]
