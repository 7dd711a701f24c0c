"""`make demo`: run the daily DAG through Airflow for the demo days, then say where everything is.

For each demo day D it runs `airflow dags test gem_daily <D+1>` (a manual run covers the last full
day before its logical date, so it processes ds=D; see gem/orchestration.py) against a SQLite
metadata DB in .airflow/, with $GEM_CONFIG pointing the jobs at the demo config. At the end it
reads the tables back through the Delta log with the `deltalake` package (no Spark) and prints
their locations, row counts per day and the data-quality report's path.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from gem.config import REPO_ROOT, GemConfig, load_config
from gem.orchestration import demo_logical_dates

DEFAULT_CONFIG = REPO_ROOT / "configs" / "demo.yaml"


def _airflow(cmd: str, env: dict[str, str]) -> None:
    script = f". infra/airflow/airflow_env.sh && {cmd}"
    subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, env=env, check=True)


def run_days(cfg_path: Path, cfg: GemConfig) -> list[tuple[str, float]]:
    env = dict(os.environ, GEM_CONFIG=str(cfg_path.resolve()))
    env.setdefault("GEM_TASK_RETRIES", "1")
    env.setdefault("GEM_TASK_RETRY_DELAY_S", "10")  # a demo fails fast instead of waiting 5 minutes
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    _airflow("bash infra/airflow/init_db.sh >/dev/null", env)
    timings = []
    for logical_date in demo_logical_dates(cfg.demo.start_ds, cfg.demo.days):
        t0 = time.time()
        _airflow(f"airflow dags test gem_daily {logical_date}", env)
        timings.append((logical_date, time.time() - t0))
    return timings


def summarize(cfg: GemConfig) -> str:
    """Row counts per ds of each table, from the Delta log alone (the way non-Spark readers list files).

    The counts come from the log's per-file statistics (`num_records`, partition values), so no data
    file is read. (Materialising tables with deltalake's `to_pyarrow_table` here made the interpreter
    abort at exit about half the time: "terminate called without an active exception".)
    """
    import pyarrow as pa
    from deltalake import DeltaTable

    from gem.quality import docs_site_dir
    from schemas import TABLES

    lines = []
    for name, schema in TABLES.items():
        path = schema.path(cfg.lakehouse_uri)
        if not Path(path, "_delta_log").is_dir():
            lines.append(f"  {name:<22} {path}  (not written)")
            continue
        table = DeltaTable(path)
        actions = pa.table(table.get_add_actions(flatten=True))
        rows_by_ds: dict[object, int] = {}
        for ds, n in zip(actions["partition.ds"].to_pylist(), actions["num_records"].to_pylist()):
            rows_by_ds[ds] = rows_by_ds.get(ds, 0) + int(n or 0)
        per_day = ", ".join(f"{ds}: {n:,}" for ds, n in sorted(rows_by_ds.items()))
        lines.append(f"  {name:<22} {path}  (version {table.version()}; rows by ds: {per_day})")
    lines.append(f"  {'data-quality report':<22} {docs_site_dir(cfg) / 'index.html'}")
    return "\n".join(lines)


def model_metrics(cfg: GemConfig) -> str:
    """The pretraining runs' held-out NE / AUC / calibration per task, from gold.metrics (read
    through the Delta log, file by file with pyarrow, as `summarize` does)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    from gem.evaluate import metrics_table
    from schemas.metrics import GOLD_METRICS

    path = GOLD_METRICS.path(cfg.lakehouse_uri)
    if not Path(path, "_delta_log").is_dir():
        return "  no pretraining run yet (gold.metrics not written)"
    actions = pa.table(DeltaTable(path).get_add_actions(flatten=True))
    rows = [r for p in actions["path"].to_pylist() for r in pq.read_table(f"{path}/{p}").to_pylist()]
    lines = []
    for run_id in sorted({r["run_id"] for r in rows}):
        run = sorted((r for r in rows if r["run_id"] == run_id), key=lambda r: r["task"])
        lines.append(f"  run {run_id} (held-out day of mix {run[0]['ds']}, {run[0]['train_steps']} steps):")
        lines.append(metrics_table({r["task"]: r for r in run}, indent="    "))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    args = parser.parse_args(argv)
    cfg_path = Path(args.config)
    cfg = load_config(cfg_path)
    t0 = time.time()
    timings = run_days(cfg_path, cfg)
    print("\n== GEM demo done ==")
    for logical_date, seconds in timings:
        print(f"  gem_daily run (logical date {logical_date}): {seconds:.0f}s")
    print(f"  total wall time: {time.time() - t0:.0f}s")
    print(f"  {'landing files':<22} {cfg.landing_root}")
    print(summarize(cfg))
    print("== pretraining: held-out metrics per task (gold.metrics) ==")
    print(model_metrics(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
