"""The run report of one day (`gem report --ds D`): what the pipeline did on D and the days before it.

One HTML page with matplotlib PNGs at `{lakehouse}/_reports/runs/<D>/index.html` (a local folder or
an object store prefix: rendered locally, then published whole by gem.report.publish), built only
from what the stages committed, with no Spark (Delta tables are read through their log):

- rows per stage and day: the completion records (_ops.completions) of the report's window;
- quarantine by reason, per stage and day, from the same records;
- data quality: every Great Expectations suite validated for D, its verdict and a link to its
  Data Docs page;
- held-out NE / AUC / calibration per task of each pretraining run in the window (gold.metrics),
  the generator's Bayes floor beside NE where the landing manifest records one;
- promotion: every decision of the window on a trained model (foundation model and students), the
  gate's NE per label type beside the promoted model's, refusals and promotions by hand
  (gem.train.promotion);
- the training loss of D's promoted model, step by step (kept in its checkpoint);
- precompute's figures for the window (gold.precompute_stats);
- the students of the newest distillation run in the window beside the FM's logged predictions
  (gold.metrics).

A part whose stage has not run (yet) says so instead of failing, so the report of any day renders;
a day with no completion record at all is an error (nothing ran: check the day and the config).
"""

from __future__ import annotations

import datetime as dt
import os
import posixpath
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import numpy as np
from matplotlib.figure import Figure

from gem import storage
from gem.config import GemConfig
from gem.data.delta_log import read_table
from gem.days import day_range, shift_day
from gem.lakehouse.stages import RECORDED_STAGES, held_out_day
from gem.lakehouse.staleness import all_records
from gem.lakehouse.tables import table_exists
from gem.quality.results import day_results
from gem.report import Link, Report
from gem.sources.bayes_floor import reported_floor
from gem.train.promotion import GATE, OVERRIDE, checkpoint_root, decisions, model_names, promotions
from schemas.metrics import GOLD_METRICS
from schemas.precompute import GOLD_PRECOMPUTE_STATS

WINDOW_DAYS = 7  # the days a report looks back over, D included


class NothingRanError(ValueError):
    """The day has no completion record: no stage ran it."""


def report_dir(cfg: GemConfig, ds: str) -> str:
    """Where the report of ds is published: {lakehouse}/_reports/runs/<ds>/."""
    return storage.join(cfg.lakehouse_uri, "_reports", "runs", ds)


def _window(cfg: GemConfig, ds: str, days: int) -> list[str]:
    return day_range(max(cfg.start_ds, shift_day(ds, -(days - 1))), ds)


def _read(cfg: GemConfig, schema: Any) -> list[dict[str, Any]]:
    """Every row of a table, read through its Delta log; [] when the table does not exist yet."""
    path = schema.path(cfg.lakehouse_uri)
    if not table_exists(path):
        return []
    return read_table(path).to_pylist()


def _stage_rows(records: dict[tuple[str, str], dict[str, Any]], days: Sequence[str]) -> list[dict[str, object]]:
    """One row per registry stage: rows written per day ('-' where no record)."""
    rows = []
    for stage in RECORDED_STAGES:
        row: dict[str, object] = {"stage": stage.name}
        for day in days:
            record = records.get((stage.name, day))
            row[day] = record["rows_written"] if record else "-"
        rows.append(row)
    return rows


def _rows_figure(records: dict[tuple[str, str], dict[str, Any]], days: Sequence[str]) -> Figure:
    fig = Figure(figsize=(8.0, 3.8))
    ax = fig.add_subplot()
    x = np.arange(len(days))
    top = 1.0
    for stage in RECORDED_STAGES:
        counts = np.array([records[(stage.name, d)]["rows_written"] if (stage.name, d) in records else np.nan
                           for d in days], dtype=float)
        if not np.isnan(counts).all():
            ax.plot(x, counts, marker="o", label=stage.name)
            top = max(top, float(np.nanmax(counts)))
    ax.set_xticks(x, days, rotation=30 if len(days) > 3 else 0)
    ax.set_yscale("symlog")  # log above 1 row, linear below: a stage that wrote 0 rows still shows
    ax.set_ylim(0, top * 3)  # headroom above the largest count on the log part
    ax.set_ylabel("rows written")
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    return fig


def _quarantine_rows(records: dict[tuple[str, str], dict[str, Any]], days: Sequence[str]) -> list[dict[str, object]]:
    """(stage, day, reason, rows) for every quarantined reason with a count, plus each stage's input
    and written counts so a reader sees the share."""
    rows = []
    for (stage, day), record in sorted(records.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if day not in days:
            continue
        for reason, count in sorted(record["quarantined_by_reason"].items()):
            if count:
                rows.append({"day": day, "stage": stage, "reason": reason, "rows": count,
                             "rows_in": record["rows_in"], "rows_written": record["rows_written"]})
    return rows


def _quarantine_figure(rows: list[dict[str, object]], days: Sequence[str]) -> Figure:
    reasons = sorted({f"{r['stage']}: {r['reason']}" for r in rows})
    fig = Figure(figsize=(8.0, 0.35 * len(reasons) + 1.8))
    ax = fig.add_subplot()
    left = np.zeros(len(reasons))
    for day in days:
        counts = np.array([sum(int(r["rows"]) for r in rows if r["day"] == day and f"{r['stage']}: {r['reason']}" == k)
                           for k in reasons], dtype=float)
        if counts.any():
            ax.barh(reasons, counts, left=left, label=day)
            left += counts
    ax.set_xlabel("rows quarantined")
    ax.invert_yaxis()
    ax.legend(fontsize=7)
    return fig


def _relative_link(page: str, out_dir: str) -> str | None:
    """`page` relative to `out_dir` when both are in one store (the same bucket), else None."""
    page, out_dir = storage.normalized(page), storage.normalized(out_dir)
    if storage.is_local(page) or storage.is_local(out_dir):
        return os.path.relpath(page, out_dir) if storage.is_local(page) == storage.is_local(out_dir) else None
    (page_store, page_key), (out_store, out_key) = (u.split("://", 1) for u in (page, out_dir))
    if page_store != out_store or page_key.split("/", 1)[0] != out_key.split("/", 1)[0]:
        return None
    return posixpath.relpath(page_key, out_key)


def _docs_link(page: str | None, out_dir: str) -> object:
    if page is None:
        return "(no Data Docs page)"
    # Relative, so the lakehouse folder (or bucket) can be moved or served as a whole; quoted,
    # because run names hold ':' (a first path segment with ':' would read as a URL scheme). A
    # page in another store than the report is linked by its URI.
    relative = _relative_link(page, out_dir)
    return Link("Data Docs", quote(relative) if relative is not None else page)


def _metrics_figure(rows: list[dict[str, Any]]) -> Figure:
    """One day's run: NE per task as bars with the Bayes floor marked, AUC per task beside it."""
    rows = sorted(rows, key=lambda r: r["task"])
    tasks = [r["task"] for r in rows]
    y = np.arange(len(tasks))

    def as_float(key: str) -> np.ndarray:
        return np.array([r[key] for r in rows], dtype=float)  # None (no positives) -> nan: no bar

    fig = Figure(figsize=(9.0, 0.24 * len(tasks) + 1.4))
    ne_ax, auc_ax = fig.subplots(1, 2, sharey=True)
    ne_ax.barh(y, as_float("NE"), color="#4c72b0", label="model")
    ne_ax.scatter(as_float("floor"), y, marker="|", s=120, color="#c44e52", zorder=3, label="Bayes floor")
    ne_ax.axvline(1.0, color="grey", linewidth=0.8)
    ne_ax.set_xlabel("held-out NE (1 = the base rate)")
    ne_ax.legend(fontsize=7, loc="lower right")
    auc_ax.barh(y, as_float("AUC"), color="#55a868")
    auc_ax.axvline(0.5, color="grey", linewidth=0.8)
    auc_ax.set_xlim(0.0, 1.0)
    auc_ax.set_xlabel("held-out AUC")
    ne_ax.set_yticks(y, tasks, fontsize=7)
    ne_ax.invert_yaxis()
    for ax in (ne_ax, auc_ax):
        ax.grid(axis="x", alpha=0.3)
    return fig


def _trend_figure(rows: list[dict[str, Any]]) -> Figure:
    """Held-out NE of the click tasks over the window's days (conversion tasks are too sparse for a
    day-to-day line to mean much)."""
    days = sorted({r["day"] for r in rows})
    fig = Figure(figsize=(8.0, 3.6))
    ax = fig.add_subplot()
    x = np.arange(len(days))
    for task in sorted({r["task"] for r in rows if r["task"].endswith("/click")}):
        by_day = {r["day"]: r["NE"] for r in rows if r["task"] == task}
        ax.plot(x, np.array([by_day.get(d) for d in days], dtype=float), marker="o", label=task)
    ax.set_xticks(x, days, rotation=30 if len(days) > 3 else 0)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_ylabel("held-out NE")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    return fig


def _latest_runs(rows: list[dict[str, Any]], arch: str) -> list[dict[str, Any]]:
    """Per day, the rows of the newest run of `arch` (a rerun replaces a day's rows, but be safe)."""
    newest: dict[str, tuple[Any, str]] = {}
    for r in rows:
        if r["arch"] == arch:
            day = r["ds"].isoformat()
            if day not in newest or r["created_at"] > newest[day][0]:
                newest[day] = (r["created_at"], r["run_id"])
    keep = {run_id for _, run_id in newest.values()}
    return [r for r in rows if r["run_id"] in keep]


def student_results(cfg: GemConfig, days: Sequence[str] | None = None) -> tuple[str, str, list[dict[str, Any]]] | None:
    """The newest distillation run (of `days`, when given) from gold.metrics -> (run_id, student
    arch, per task: task, examples, positives (held out), steps (the student's training steps that day), NE, AUC, baseline
    NE, baseline AUC (the no-FM baseline student beside it, None where the run trained none), FM NE,
    FM AUC: the student beside the baseline and the FM's logged predictions of the same held-out
    examples); None when no distill run wrote any."""
    from gem.distill.run import FM_ARCH, student_arch  # noqa: PLC0415 - the report renders without torch

    arch, baseline = student_arch(cfg.student.variant), student_arch("baseline")
    rows = [r for r in _read(cfg, GOLD_METRICS)
            if r["arch"] in (arch, baseline, FM_ARCH) and (days is None or r["ds"].isoformat() in days)]
    if not rows:
        return None
    run_id = max(rows, key=lambda r: r["created_at"])["run_id"]
    by_task: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["run_id"] == run_id and r["ne"] is not None:
            by_task.setdefault(r["task"], {})[r["arch"]] = r
    out = []
    for task, pair in sorted(by_task.items()):
        student, control, fm = pair.get(arch, {}), pair.get(baseline, {}), pair.get(FM_ARCH, {})
        out.append({"task": task, "examples": student.get("examples", 0), "positives": student.get("positives", 0.0),
                    "steps": student.get("train_steps"),
                    "NE": student.get("ne"), "AUC": student.get("auc"), "baseline NE": control.get("ne"),
                    "baseline AUC": control.get("auc"), "FM NE": fm.get("ne"), "FM AUC": fm.get("auc")})
    return run_id, arch, out


def promotion_rows(cfg: GemConfig, days: Sequence[str]) -> tuple[list[dict[str, object]], list[str]]:
    """(one row per decision of `days` and label type it judged, the summary line of each decision
    that refused a model or was made by hand), every model's decisions, oldest day first."""
    root = checkpoint_root(cfg)
    rows: list[dict[str, object]] = []
    notes = []
    for name in model_names(root):
        for d in decisions(root, name):
            if d.mix_ds not in days:
                continue
            verdict = ("promoted" if d.promoted else "NOT promoted") if d.how == GATE else (
                f"{'override' if d.how == OVERRIDE else 'rollback'} by {d.by}")
            base = {"day": d.mix_ds, "model": d.model.version, "decision": verdict, "against": d.against or "-"}
            rows += [base | {"label": f.label, "tasks": len(f.tasks), "positives": f.positives, "NE": f.candidate_ne,
                             "promoted NE": f.promoted_ne} for f in d.figures] or [base | {"label": "-"}]
            if not d.promoted or d.how != GATE:
                notes.append(d.summary())
    return rows, notes


def _students_figure(rows: list[dict[str, Any]]) -> Figure:
    """Held-out NE per task: each student beside the no-FM baseline student (where the run trained
    one) and the FM's logged predictions."""
    tasks = [r["task"] for r in rows]
    y = np.arange(len(tasks))
    fig = Figure(figsize=(7.0, 0.4 * len(tasks) + 1.4))
    ax = fig.add_subplot()
    bars = [(key, label, color) for key, label, color in (
        ("baseline NE", "baseline student (no FM)", "#999999"), ("NE", "student", "#4c72b0"),
        ("FM NE", "FM (logged predictions)", "#dd8452")) if any(r.get(key) is not None for r in rows)]
    height = 0.8 / len(bars)
    for i, (key, label, color) in enumerate(bars):
        ax.barh(y + (i - (len(bars) - 1) / 2) * height, np.array([r.get(key) for r in rows], dtype=float),
                height=height, color=color, label=label)
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set_yticks(y, tasks, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("held-out NE (1 = the base rate)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return fig


def _loss_figure(losses: Sequence[float]) -> Figure:
    fig = Figure(figsize=(7.0, 3.4))
    ax = fig.add_subplot()
    steps = np.arange(1, len(losses) + 1)
    ax.plot(steps, losses, linewidth=0.8, alpha=0.5, label="step loss")
    window = max(1, len(losses) // 20)
    if len(losses) >= 2 * window > 1:  # a moving mean: single steps are noisy at small batches
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], smooth, linewidth=1.8, label=f"mean of {window} steps")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def loss_summary(version: str, losses: Sequence[float]) -> str:
    """One line on a run's loss: its means over the first and the last tenth of the steps (single
    steps are noisy at small batches, and a warm-started run's first step says little)."""
    k = max(1, len(losses) // 10)
    return (f"{version}: {len(losses)} steps; mean loss {np.mean(losses[:k]):.4f} over the first {k}, "
            f"{np.mean(losses[-k:]):.4f} over the last {k}.")


def promoted_losses(cfg: GemConfig, ds: str) -> tuple[str, list[float]] | None:
    """(model version, every step's loss) of the model promoted for mixture day ds, or None."""
    from gem.train.daily import checkpoint_root  # noqa: PLC0415 - the report renders without torch

    for promotion in promotions(checkpoint_root(cfg), cfg.model.arch):
        if promotion.mix_ds == ds:
            extra = storage.join(str(promotion.checkpoint), "extra.json")
            if storage.exists(extra):
                return promotion.version, [float(v) for v in storage.read_json(extra)["losses"]]
    return None


def build(cfg: GemConfig, ds: str, window_days: int = WINDOW_DAYS) -> Report:
    """The report of ds (see the module docstring); NothingRanError when no stage ran ds."""
    records = all_records(cfg)
    if not any(day == ds for _, day in records):
        known = sorted({day for _, day in records})
        span = f"{known[0]}..{known[-1]}" if known else "none"
        raise NothingRanError(f"no stage has a completion record for ds={ds} in {cfg.lakehouse_uri} "
                              f"(days with records: {span}); run the day first (`gem run --ds {ds}`)")
    days = _window(cfg, ds, window_days)
    out_dir = report_dir(cfg, ds)
    report = Report(title=f"GEM run report, ds={ds}", subtitle=f"the daily pipeline over {days[0]}..{days[-1]}")
    report.meta("lakehouse", cfg.lakehouse_uri)
    report.meta("written", dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))

    sec = report.section("Rows per stage and day", intro=(
        "Rows each stage wrote, from its completion record (_ops.completions): '-' where the stage has no "
        "record for the day (not run yet, skipped, or nothing to do)."))
    sec.table(_stage_rows(records, days), columns=["stage", *days])
    sec.figure(_rows_figure(records, days), "rows_per_stage", caption="rows written per stage and day (symlog scale)")
    missing = [s.name for s in RECORDED_STAGES if (s.name, ds) not in records]
    if missing:
        sec.paragraph(f"No record for ds={ds}: {', '.join(missing)}.")

    sec = report.section("Quarantine by reason", intro=(
        "Rows a stage set aside instead of writing, with the reason it recorded (rows_in = rows_written + "
        "quarantined, checked when the record was written)."))
    quarantine = _quarantine_rows(records, days)
    if quarantine:
        sec.table(quarantine, columns=["day", "stage", "reason", "rows", "rows_in", "rows_written"])
        sec.figure(_quarantine_figure(quarantine, days), "quarantine", caption="rows quarantined by stage and reason")
    else:
        sec.paragraph("Nothing was quarantined in the window.")

    sec = report.section("Data quality", intro=(
        f"Every Great Expectations suite validated for ds={ds}, its newest result. Critical failures fail "
        "the day's stage; warnings are only reported."))
    suites = day_results(cfg, ds)
    if suites:
        sec.table([{"suite": r.suite, "batch": r.run_name,
                    "verdict": "passed" if r.success else ("FAILED" if r.failed_critical else "warnings"),
                    "expectations": r.evaluated, "critical failures": r.failed_critical,
                    "warnings": r.failed_warning, "details": _docs_link(r.docs_page, out_dir)} for r in suites])
    else:
        sec.paragraph(f"No suite was validated for ds={ds}.")

    sec = report.section("Held-out metrics", intro=(
        f"Each pretraining run of {cfg.model.arch} in the window, scored on its mixture's held-out day "
        "(gold.metrics); the floor is the NE of the generator's own true probabilities on that day, "
        "the best any model can do."))
    runs = [r for r in _latest_runs(_read(cfg, GOLD_METRICS), cfg.model.arch) if r["ds"].isoformat() in days]
    if runs:
        tasks = {d: [r["task"] for r in runs if r["ds"].isoformat() == d] for d in {r["ds"].isoformat() for r in runs}}
        floors = {d: reported_floor(cfg.landing_root, held_out_day(cfg, d)[0], names) if held_out_day(cfg, d) else None
                  for d, names in tasks.items()}
        rows = []
        for r in sorted(runs, key=lambda r: (r["ds"], r["task"])):
            floor = (floors.get(r["ds"].isoformat()) or {}).get(r["task"])
            readable = r["positives"] >= cfg.report.min_positives  # else its NE is noise: not shown
            rows.append({"day": r["ds"].isoformat(), "task": r["task"], "examples": r["examples"],
                         "positives": r["positives"], "NE": r["ne"] if readable else None, "floor": floor,
                         "AUC": r["auc"] if readable else None,
                         "calibration": r["calibration"] if readable else None, "steps": r["train_steps"],
                         "note": "" if readable else f"too few positives (< {cfg.report.min_positives})"})
        sec.paragraph(f"A task with fewer than report.min_positives ({cfg.report.min_positives}) held-out positives "
                      "shows no NE, AUC or calibration: over so few positives they are noise. all/<label type> pools "
                      "that label type's tasks over the surfaces.")
        sec.table(rows, formats={"positives": "{:.0f}", "NE": "{:.4f}", "floor": "{:.4f}", "AUC": "{:.4f}",
                                 "calibration": "{:.3f}"})
        last = max(r["day"] for r in rows)
        sec.figure(_metrics_figure([r for r in rows if r["day"] == last]), "held_out_metrics",
                   caption=f"held-out NE (red: the Bayes floor) and AUC per task, the run of {last}")
        if len({r["day"] for r in rows}) > 1:
            sec.figure(_trend_figure(rows), "held_out_trend", caption="held-out NE of the click tasks, day by day")
    else:
        sec.paragraph(f"No pretraining run of {cfg.model.arch} wrote gold.metrics in the window.")

    sec = report.section("Promotion", intro=(
        "Each decision of the window on a trained model, the foundation model's and each surface's student's: "
        "the promotion gate's, which compares its held-out NE per label type (tasks pooled across surfaces) with "
        "the promoted model's on the same examples ('promoted NE'; none before the first promotion, where the bar "
        "is 1, the base rate), or one made by hand with `gem promote`. A refused model is not used: precompute "
        "and the students keep reading the promoted one."))
    decided, notes = promotion_rows(cfg, days)
    if decided:
        sec.table(decided, columns=["day", "model", "decision", "label", "tasks", "positives", "NE", "promoted NE",
                                    "against"],
                  formats={"positives": "{:.0f}", "NE": "{:.4f}", "promoted NE": "{:.4f}"})
        for note in notes:
            sec.paragraph(note)
    else:
        sec.paragraph("No model was decided on in the window.")

    sec = report.section("Training loss", intro=f"Every step's loss of the model promoted for ds={ds}.")
    losses = promoted_losses(cfg, ds)
    if losses:
        version, values = losses
        sec.paragraph(loss_summary(version, values))
        sec.figure(_loss_figure(values), "training_loss", caption=f"training loss of {version}")
    else:
        sec.paragraph(f"No model of {cfg.model.arch} was promoted for ds={ds}.")

    sec = report.section("Precompute", intro=(
        "The foundation model's precompute (gold.precompute_stats): users computed and carried forward, "
        "and how the speculative pairs of the day before were used."))
    stats = sorted((r for r in _read(cfg, GOLD_PRECOMPUTE_STATS) if r["ds"].isoformat() in days),
                   key=lambda r: r["ds"])
    if stats:
        sec.table([{"day": r["ds"].isoformat(), "model": r["model_version"], "refreshed": r["refreshed"],
                    "users": r["users_total"], "computed": r["users_computed"], "carried": r["users_carried"],
                    "predictions": r["predictions"], "speculative pairs": r["speculative_pairs"],
                    "hit rate": r["hit_rate"], "wasted": r["wasted_share"], "model age (days)": r["model_age_days"]}
                   for r in stats], formats={"hit rate": "{:.1%}", "wasted": "{:.1%}"})
    else:
        sec.paragraph("Precompute has not run in the window.")

    sec = report.section("Students", intro=(
        "The newest distillation run in the window: each surface's student, trained on the FM's logged "
        "predictions, scored on the held-out day beside the no-FM baseline student trained on the same days "
        "and steps, and beside the FM's predictions (gold.metrics)."))
    students = student_results(cfg, days)
    if students:
        run_id, arch, rows = students
        shown = ("NE", "AUC", "baseline NE", "baseline AUC", "FM NE", "FM AUC")
        rows = [r if r["positives"] >= cfg.report.min_positives else  # else its figures are noise: not shown
                r | dict.fromkeys(shown) | {"note": f"too few positives (< {cfg.report.min_positives})"} for r in rows]
        sec.paragraph(f"{run_id}: {arch}, {len(rows)} tasks scored; a task with fewer than report.min_positives "
                      f"({cfg.report.min_positives}) held-out positives shows no figures.")
        sec.table(rows, formats={"positives": "{:.0f}"} | {k: "{:.4f}" for k in shown})
        if any(r["NE"] is not None for r in rows):
            sec.figure(_students_figure(rows), "students",
                       caption="held-out NE per task: the no-FM baseline student, the student and the FM")
    else:
        sec.paragraph("No distillation run wrote gold.metrics in the window.")
    return report


def write(cfg: GemConfig, ds: str, window_days: int = WINDOW_DAYS) -> str:
    """Build and publish the report of ds -> the URI of its index.html (a path on a local disk)."""
    return build(cfg, ds, window_days).write(report_dir(cfg, ds))
