"""The stored validation results of one day: each suite's latest verdict and its Data Docs page.

`gem.quality.runner.validate` stores every result in the file-backed GX context at `cfg.gx_root`
(published there when the gx_root is on an object store) under
`uncommitted/validations/<suite path>/<run name>/<run time>/<batch>.json`, and the Data Docs site
mirrors that path with `.html`. A run name is the day (`2026-01-03`) or a stage and the day
(`ingest_events:2026-01-03`). Reading the JSON files directly (through gem.storage) costs
milliseconds and no GX import (seconds), which is what a report listing a day's suites needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from gem import storage
from gem.config import GemConfig
from gem.quality.runner import docs_site_uri, results_uri


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
    docs_page: str | None  # its Data Docs page (a path or URI), None when the site has none (docs not built)


def _names_day(run_name: str, ds: str) -> bool:
    return run_name == ds or run_name.endswith(f":{ds}")


def _relative(uri: str, base: str) -> tuple[str, ...]:
    """The path parts of `uri` below the prefix `base` (both as gem.storage spells them)."""
    return tuple(storage.normalized(uri)[len(storage.normalized(base)) + 1:].split("/"))


def day_results(cfg: GemConfig, ds: str) -> list[SuiteResult]:
    """Every suite validated for `ds`, its newest result (a rerun's replaces an earlier one's), by
    suite name. Empty when nothing was validated that day (or no context exists yet)."""
    root = results_uri(cfg)
    newest: dict[str, tuple[str, tuple[str, ...], dict]] = {}
    for uri in storage.walk_files(root):
        rel = _relative(uri, root)  # <suite path...>/<run name>/<run time>/<batch>.json
        if not rel[-1].endswith(".json") or rel[-1].startswith(".") or len(rel) < 4 or not _names_day(rel[-3], ds):
            continue
        data = storage.read_json(uri)
        suite, run_time = str(data.get("suite_name") or ".".join(rel[:-3])), rel[-2]
        if suite not in newest or run_time > newest[suite][0]:
            newest[suite] = (run_time, rel, data)
    if not newest:
        return []
    site = storage.join(docs_site_uri(cfg), "validations")
    pages = {storage.normalized(p) for p in storage.walk_files(site)}
    out = []
    for suite, (run_time, rel, data) in sorted(newest.items()):
        failed = [(r.get("expectation_config") or {}).get("meta") or {}
                  for r in data.get("results", []) if not r.get("success")]
        critical = sum(bool(meta.get("critical", True)) for meta in failed)
        page = storage.join(site, *rel[:-1], rel[-1].removesuffix(".json") + ".html")
        out.append(SuiteResult(
            suite=suite, run_name=rel[-3], success=bool(data.get("success")),
            evaluated=len(data.get("results", [])), failed_critical=critical, failed_warning=len(failed) - critical,
            run_time=run_time, docs_page=page if page in pages else None))
    return out
