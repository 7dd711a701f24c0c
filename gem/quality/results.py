"""The stored validation results of one day: each suite's latest verdict and its Data Docs page.

`gem.quality.runner.validate` stores every result in the file-backed GX context at `cfg.gx_root`
under `uncommitted/validations/<suite path>/<run name>/<run time>/<batch>.json`, and the Data Docs
site mirrors that path with `.html`. A run name is the day (`2026-01-03`) or a stage and the day
(`ingest_events:2026-01-03`). Reading the JSON files directly costs milliseconds and no GX import
(seconds), which is what a report listing a day's suites needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gem.config import GemConfig
from gem.quality.runner import docs_site_dir, results_dir


@dataclass(frozen=True)
class SuiteResult:
    """The latest validation of one suite for a day."""

    suite: str  # e.g. "bronze.ad_events.schema"
    run_name: str  # the batch label it was validated under
    success: bool
    evaluated: int  # expectations evaluated
    failed_critical: int  # unsuccessful expectations that fail the day (unmarked ones count, as in runner)
    failed_warning: int  # unsuccessful expectations that only warn
    run_time: str  # GX's run-time folder name, e.g. 20260103T180452.229045Z
    docs_page: Path | None  # its Data Docs page, None when the site has none (docs not built)


def _names_day(run_name: str, ds: str) -> bool:
    return run_name == ds or run_name.endswith(f":{ds}")


def day_results(cfg: GemConfig, ds: str) -> list[SuiteResult]:
    """Every suite validated for `ds`, its newest result (a rerun's replaces an earlier one's), by
    suite name. Empty when nothing was validated that day (or no context exists yet)."""
    root = results_dir(cfg)
    if not root.is_dir():
        return []
    newest: dict[str, tuple[str, Path]] = {}
    for path in root.rglob("*.json"):
        rel = path.relative_to(root)  # <suite path...>/<run name>/<run time>/<batch>.json
        if len(rel.parts) < 4 or not _names_day(rel.parts[-3], ds):
            continue
        data = json.loads(path.read_text())
        suite, run_time = str(data.get("suite_name") or ".".join(rel.parts[:-3])), rel.parts[-2]
        if suite not in newest or run_time > newest[suite][0]:
            newest[suite] = (run_time, path)
    out = []
    site = docs_site_dir(cfg) / "validations"
    for suite, (run_time, path) in sorted(newest.items()):
        data = json.loads(path.read_text())
        failed = [(r.get("expectation_config") or {}).get("meta") or {}
                  for r in data.get("results", []) if not r.get("success")]
        critical = sum(bool(meta.get("critical", True)) for meta in failed)
        page = site / path.relative_to(root).with_suffix(".html")
        out.append(SuiteResult(
            suite=suite, run_name=path.relative_to(root).parts[-3], success=bool(data.get("success")),
            evaluated=len(data.get("results", [])), failed_critical=critical, failed_warning=len(failed) - critical,
            run_time=run_time, docs_page=page if page.is_file() else None))
    return out
