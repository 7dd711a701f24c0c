"""The study's HTML report (gem.report) from results.json's numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from gem.report import Report
from gem.report.plots import interval_bars
from gem.study.presets import ARCHS

NE = "{:.4f}"


def interval_text(x: list[float | None] | None) -> str:
    """mean [low, high]; the mean alone when the interval is undefined (one value), n/a without one."""
    if x is None or x[0] is None:
        return "n/a"
    return f"{x[0]:.4f}" if None in x else f"{x[0]:.4f} [{x[1]:.4f}, {x[2]:.4f}]"


def _num(x: float | None) -> str:
    return "n/a" if x is None else NE.format(x)


def scaling_figure(r: dict[str, Any]) -> Any:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arch in ARCHS:
        s = r["scaling"][arch]
        flops, ne = np.array(s["flops"]), np.array(s["ne"])
        line = ax.errorbar(flops, ne.mean(0), yerr=ne.std(0), marker="o", linestyle="none", label=arch, capsize=3)
        if s["eta"] is None:  # one size: no fit
            continue
        grid = np.geomspace(flops.min(), flops.max(), 50)
        ax.plot(grid, s["ne0"] - s["eta"] * np.log(grid), color=line[0].get_color(), linewidth=1)
    if r["floor"]["ne"] is not None:
        ax.axhline(r["floor"]["ne"], color="black", linestyle="--", linewidth=1, label="Bayes floor")
    ax.set_xscale("log")
    ax.set_xlabel("forward FLOPs per example")
    ax.set_ylabel("held-out NE (all tasks pooled)")
    ax.legend()
    return fig


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
    floor = r["floor"]

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
    rows = [{"arch": a, "FLOPs/example": m["flops"], "lr": m["lr"], "NE": interval_text(m["ne"]),
             "NE click": interval_text(m["ne_click"]),
             "NE conversion": interval_text(m["ne_conversion"])} for a, m in r["matched"].items()]
    rows.append({"arch": "Bayes floor", "FLOPs/example": "", "lr": "", "NE": _num(floor["ne"]),
                 "NE click": _num(floor["ne_click"]), "NE conversion": _num(floor["ne_conversion"])})
    sec.table(rows, caption="held-out NE, mean [95% interval] over seeds")
    bars = {a: m["ne"] for a, m in r["matched"].items()}
    if all(None not in v for v in bars.values()):
        sec.figure(interval_bars(bars, ylabel="held-out NE (all tasks pooled)", reference=floor["ne"]),
                   name="matched", caption="held-out NE at matched compute, mean and 95% interval over seeds; "
                   "dashed: the Bayes floor")
    per_task = {}
    for a in r["matched"]:
        for seed in r["jobs"][f"{a}@{p['matched']}"]["seeds"]:
            for t, v in seed["tasks"].items():
                per_task.setdefault(t, {}).setdefault(a, []).append(v)
    sec.table([{"task": t, **{a: np.mean(v) for a, v in by.items()}, "floor": floor["tasks"].get(t)}
               for t, by in sorted(per_task.items())],
              caption=f"held-out NE per task (mean over seeds; tasks with >= {p['min_positives']} positives)",
              formats={a: NE for a in r["matched"]} | {"floor": NE})

    sec = report.section("Scaling", intro="NE(C) = NE0 - eta ln C, least squares over model sizes "
                         "(C = forward FLOPs per example); eta's interval from per-seed fits.")
    sec.figure(scaling_figure(r), name="scaling", caption="held-out NE against FLOPs per example, with the fits")
    sec.table([{"arch": a, "sizes": len(r["scaling"][a]["flops"]), "NE0": r["scaling"][a]["ne0"],
                "eta": interval_text(r["scaling"][a]["eta_interval"])} for a in ARCHS], formats={"NE0": NE})
    ratio = r["scaling"]["ratio"]
    sec.paragraph(f"eta(Kunlun) / eta(InterFormer) = {interval_text(ratio)}")

    sec = report.section("Data-limited check", intro=(
        "The top size of each scaled architecture trained on the first half of the training batches (seed 0, the "
        "same lr grid) against the full data's seed 0: a gap near 0 says the top of the curve is limited by data."))
    if r.get("data_limited"):
        sec.table([{"job": d["job"], "full data NE": d["full_ne"], "half data NE": d["half_ne"], "gap": d["gap"]}
                   for d in r["data_limited"]], formats={"full data NE": NE, "half data NE": NE, "gap": "{:+.4f}"})
    else:
        sec.paragraph("Not checked in this preset.")

    sec = report.section("Transfer", intro="Kunlun at the matched size trained on every task (joint) against "
                         "the same model trained on one conversion task alone, on that task's same examples.")
    if r["transfer"]:
        sec.table([{"task": t["task"], "held-out positives": t["held_out_positives"],
                    "joint": interval_text(t["joint"]),
                    "alone": interval_text(t["alone"]), "joint - alone": interval_text(t["diff"]), "floor": t["floor"],
                    "lr alone": t["lr_alone"]} for t in r["transfer"]], formats={"floor": NE})
    else:
        sec.paragraph("No conversion task was trained alone in this preset.")

    sec = report.section("Calibration", intro="Kunlun at the matched size: sum of weighted predictions / sum of "
                         "weighted labels per surface (all its tasks), goal within 5% of 1.")
    sec.table([{"surface": s, "calibration": interval_text(c)} for s, c in r["calibration"].items()])

    a = r["ablations"]
    ref = a.get("reference") or {"job": "kunlun@matched", "ne": r["matched"]["kunlun"]["ne"]}
    sec = report.section("Ablations", intro=f"Kunlun with one switch changed, re-sized to the compute of {ref['job']} "
                         "(the full Kunlun they are compared with).")
    bars = {f"full Kunlun ({ref['job']})": ref["ne"]} | {f"{v['switch']}={v['value']}": v["ne"]
                                                             for v in a["variants"]}
    if a["variants"] and all(None not in v for v in bars.values()):
        sec.figure(interval_bars(bars, ylabel="held-out NE (all tasks pooled)"), name="ablations",
                   caption="Kunlun's ablations beside the full Kunlun of their size, mean and 95% interval over seeds")
    if a["variants"]:
        sec.table([{"variant": f"{v['switch']}={v['value']}", "FLOPs/example": v["flops"], "NE": interval_text(v["ne"]),
                    "NE - full Kunlun": interval_text(v["diff"])} for v in a["variants"]])
    if a["missing"]:
        sec.paragraph("Not yet available (KunlunConfig has no such field in this checkout): " + ", ".join(a["missing"]))
    if not a["variants"] and not a["missing"]:
        sec.paragraph("Ablations were switched off in this preset.")

    sec = report.section("Tuning", intro="The same learning-rate grid for every job, each lr trained with seed 0 "
                         "and scored on the validation day; the lowest validation NE is kept.")
    sec.table([{"job": name, "shape": j["shape"], "FLOPs/example": j["flops"],
                **{f"val NE lr={t['lr']:g}": t["validation_ne"] for t in j["lr_trials"]}, "chosen lr": j["lr"],
                "train s/run": np.mean([s["seconds"] for s in j["seeds"]])} for name, j in r["jobs"].items()])
    return report.write(out_dir)
