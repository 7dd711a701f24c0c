"""The study's tables and plots from results.json's numbers, as text cells: one definition that the
HTML report (gem.study.page) and the repository's Markdown page (gem.study.publish) both lay out."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from gem.study.presets import ARCHS, SCALED

DATA_LIMITED_INTRO = (
    "The top size of each scaled architecture trained on the first half of the training batches (seed 0, the "
    "same lr grid) against the full data's seed 0: a gap near 0 says the top of the curve is limited by data, "
    "not by the model.")
TRANSFER_INTRO = ("Kunlun at the matched size trained on every task (joint) against the same model trained on "
                  "one conversion task alone, scored on that task's held-out examples.")
CALIBRATION_INTRO = ("Kunlun at the matched size: weighted predictions over weighted labels per surface (all its "
                     "tasks), goal within 5% of 1.")


def interval_text(x: list[float | None] | None) -> str:
    """mean [low, high]; the mean alone when the interval is undefined (one value), n/a without one."""
    if x is None or x[0] is None:
        return "n/a"
    return f"{x[0]:.4f}" if None in x else f"{x[0]:.4f} [{x[1]:.4f}, {x[2]:.4f}]"


def num(x: float | None, spec: str = ".4f") -> str:
    return "n/a" if x is None else format(x, spec)


def matched_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Held-out NE per architecture at matched compute, mean [95% interval] over seeds, and the floor."""
    floor = r["floor"]
    rows = [{"arch": a, "FLOPs/example": f"{m['flops']:,}", "lr": m["lr"], "NE": interval_text(m["ne"]),
             "NE click": interval_text(m["ne_click"]), "NE conversion": interval_text(m["ne_conversion"])}
            for a, m in r["matched"].items()]
    return rows + [{"arch": "Bayes floor", "FLOPs/example": "", "lr": "", "NE": num(floor["ne"]),
                    "NE click": num(floor["ne_click"]), "NE conversion": num(floor["ne_conversion"])}]


def matched_bars(r: dict[str, Any]) -> dict[str, list[float | None]]:
    return {a: m["ne"] for a, m in r["matched"].items()}


def per_task_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Held-out NE per task at matched compute (mean over seeds) per architecture, and the task's floor."""
    matched = r["preset"]["matched"]
    per_task: dict[str, dict[str, list[float]]] = {}
    for arch in r["matched"]:
        for seed in r["jobs"][f"{arch}@{matched}"]["seeds"]:
            for t, v in seed["tasks"].items():
                per_task.setdefault(t, {}).setdefault(arch, []).append(v)
    return [{"task": t, **{arch: num(float(np.mean(v))) for arch, v in by.items()},
             "floor": num(r["floor"]["tasks"].get(t))} for t, by in sorted(per_task.items())]


def scaling_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    s = r["scaling"]
    return [{"arch": a, "sizes": len(s[a]["flops"]), "NE0": num(s[a]["ne0"]),
             "eta": interval_text(s[a]["eta_interval"])} for a in SCALED]


def scaling_figure(r: dict[str, Any]) -> Any:
    """Held-out NE against forward FLOPs per example (mean and spread over seeds), each fit's line."""
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


def data_limited_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"job": d["job"], "full data NE": num(d["full_ne"]), "half data NE": num(d["half_ne"]),
             "gap (half - full)": num(d["gap"], "+.4f")} for d in r.get("data_limited") or []]


def transfer_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"task": t["task"], "held-out positives": t["held_out_positives"], "joint": interval_text(t["joint"]),
             "alone": interval_text(t["alone"]), "joint - alone": interval_text(t["diff"]), "floor": num(t["floor"]),
             "lr alone": t["lr_alone"]} for t in r["transfer"]]


def calibration_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"surface": s, "calibration": interval_text(c)} for s, c in r["calibration"].items()]


def ablation_reference(r: dict[str, Any]) -> dict[str, Any]:
    """The full Kunlun the ablations are compared with: its job's name and held-out NE interval."""
    return r["ablations"].get("reference") or {"job": "kunlun@matched", "ne": r["matched"]["kunlun"]["ne"]}


def ablation_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"variant": f"{v['switch']}={v['value']}", "FLOPs/example": f"{v['flops']:,}", "NE": interval_text(v["ne"]),
             "NE - full Kunlun": interval_text(v["diff"])} for v in r["ablations"]["variants"]]


def ablation_bars(r: dict[str, Any]) -> dict[str, list[float | None]]:
    ref = ablation_reference(r)
    return {f"full Kunlun ({ref['job']})": ref["ne"]} | {f"{v['switch']}={v['value']}": v["ne"]
                                                         for v in r["ablations"]["variants"]}


def tuning_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Each job's shape, its validation NE per learning rate of the grid, the lr chosen and its seconds per run."""
    return [{"job": name, "shape": j["shape"], "FLOPs/example": f"{j['flops']:,}",
             **{f"val NE lr={t['lr']:g}": num(t["validation_ne"]) for t in j["lr_trials"]}, "chosen lr": j["lr"],
             "train s/run": num(float(np.mean([s["seconds"] for s in j["seeds"]])), ".1f")}
            for name, j in r["jobs"].items()]


def all_defined(bars: dict[str, list[float | None]]) -> bool:
    """Every bar has a mean and an interval (a figure of them can be drawn)."""
    return all(v is not None and None not in v for v in bars.values())
