"""The study's HTML report (gem.report) from results.json's numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gem.report import Report
from gem.report.plots import interval_bars
from gem.study import tables
from gem.study.tables import interval_text


def write_report(r: dict[str, Any], claims: list[dict[str, str]], out_dir: str | Path) -> str:
    """Publish the study's report under out_dir (a local folder or an object store prefix) -> the
    URI of its index.html."""
    p = r["preset"]
    report = Report(title="GEM model quality study",
                    subtitle=f"preset {p['name']}: Kunlun (arXiv 2602.10016) against InterFormer (arXiv 2411.09852), "
                             "Wukong (arXiv 2403.02545), HSTU (arXiv 2402.17152) and DLRM on the generator's traffic")
    for key in ("commit", "wall_s", "device", "started"):
        report.meta(key=key, value=r.get(key))
    report.meta(key="preset", value=p["name"])

    sec = report.section("Claims", intro="Each verdict is computed from the numbers below (gem/study/claims.py).")
    for c in claims:
        sec.claim(c["name"], c["status"], c["detail"])

    sec = report.section("Setup", intro=(
        f"Traffic: {r['traffic']['impressions']:,} impressions, {r['traffic']['clicks']:,} clicks, "
        f"{r['traffic']['conversions']:,} conversions; training days {r['roles']['train']}, validation day "
        f"{r['roles']['validation']} (only to choose the learning rate), held-out day {r['roles']['held_out']} (only "
        f"for the reported numbers, every example, weight 1). Training negatives kept at {p['negative_rate']}, "
        f"weighted 1/rate. {p['epochs']} epoch(s), batch {p['batch_size']}, {p['seeds']} seeds; intervals are 95% "
        "(t over seeds; the eta ratio by bootstrap over seeds). NE = log loss / entropy of the base rate; the "
        "Bayes floor is the NE of the world's true probabilities on the same held-out examples."))
    sec.table([{"key": k, "value": str(v)} for k, v in p.items() if k != "traffic"] +
              [{"key": f"traffic.{k}", "value": str(v)} for k, v in p["traffic"].items()], caption="preset")

    sec = report.section("Matched compute", intro="Every architecture sized to the same forward FLOPs per example "
                         "(within 10%, gem.model.flops) and trained on the same examples.")
    sec.table(tables.matched_rows(r), caption="held-out NE, mean [95% interval] over seeds")
    bars = tables.matched_bars(r)
    if tables.all_defined(bars):
        sec.figure(interval_bars(bars, ylabel="held-out NE (all tasks pooled)", reference=r["floor"]["ne"]),
                   name="matched", caption="held-out NE at matched compute, mean and 95% interval over seeds; "
                   "dashed: the Bayes floor")
    sec.table(tables.per_task_rows(r),
              caption=f"held-out NE per task (mean over seeds; tasks with >= {p['min_positives']} positives)")

    sec = report.section("Scaling", intro="NE(C) = NE0 - eta ln C, least squares over model sizes "
                         "(C = forward FLOPs per example); eta's interval from per-seed fits.")
    sec.figure(tables.scaling_figure(r), name="scaling", caption="held-out NE against FLOPs per example, with the fits")
    sec.table(tables.scaling_rows(r))
    sec.paragraph(f"eta(Kunlun) / eta(InterFormer) = {interval_text(r['scaling']['ratio'])}")

    sec = report.section("Data-limited check", intro=tables.DATA_LIMITED_INTRO)
    if r.get("data_limited"):
        sec.table(tables.data_limited_rows(r))
    else:
        sec.paragraph("Not checked in this preset.")

    sec = report.section("Transfer", intro=tables.TRANSFER_INTRO)
    if r["transfer"]:
        sec.table(tables.transfer_rows(r))
    else:
        sec.paragraph("No conversion task was trained alone in this preset.")

    sec = report.section("Calibration", intro=tables.CALIBRATION_INTRO)
    sec.table(tables.calibration_rows(r))

    a, ref = r["ablations"], tables.ablation_reference(r)
    sec = report.section("Ablations", intro=f"Kunlun with one switch changed, re-sized to the compute of {ref['job']} "
                         "(the full Kunlun they are compared with).")
    bars = tables.ablation_bars(r)
    if a["variants"] and tables.all_defined(bars):
        sec.figure(interval_bars(bars, ylabel="held-out NE (all tasks pooled)"), name="ablations",
                   caption="Kunlun's ablations beside the full Kunlun of their size, mean and 95% interval over seeds")
    if a["variants"]:
        sec.table(tables.ablation_rows(r))
    if a["missing"]:
        sec.paragraph("Not yet available (KunlunConfig has no such field in this checkout): " + ", ".join(a["missing"]))
    if not a["variants"] and not a["missing"]:
        sec.paragraph("Ablations were switched off in this preset.")

    sec = report.section("Tuning", intro="The same learning-rate grid for every job, each lr trained with seed 0 "
                         "and scored on the validation day; the lowest validation NE is kept.")
    sec.table(tables.tuning_rows(r))
    return report.write(out_dir)
