"""Ingest throughput on this machine: generate one synthetic day, ingest it, report events/s.

`python -m bench.ingest_throughput [--events 1000000 --events 10000000] [--root /tmp/gem-bench]`

Each size gets a fresh lakehouse; the generator's and ingest's seconds are reported separately,
ingest's events/s counts every landing line (good and quarantined); the figures are published through
bench.results (ingest_throughput). Not a test: nothing here gates CI.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from bench.results import RESULTS_DIR, Figure, ResultsDirOption, record
from gem.command_line import job_app, run_command
from gem.config import load_config
from gem.lakehouse.commit import StageContext
from gem.lakehouse.spark import get_spark
from gem.sources.synthetic_day import generate_day
from jobs import ingest_events

DAY = "2026-01-01"


def run_size(root: Path, events: int, master: str) -> dict[str, float]:
    shutil.rmtree(root, ignore_errors=True)
    users = max(10_000, events // 50)
    cfg = load_config(
        overrides={
            "lakehouse_uri": str(root / "lakehouse"),
            "spark": {"master": master, "driver_memory": "8g"},
            "generator": {"events_per_day": events, "users": users, "ads": max(2_000, users // 10)},
        },
        environ={},
    )
    t0 = time.time()
    generate_day(cfg, DAY)
    gen_s = time.time() - t0
    spark = get_spark(cfg, app_name="bench-ingest")
    t1 = time.time()
    result = ingest_events.run(StageContext(cfg, spark), DAY)
    ingest_s = time.time() - t1
    return {
        "events": float(result.rows_in),
        "generate_s": gen_s,
        "ingest_s": ingest_s,
        "ingest_events_per_s": result.rows_in / ingest_s,
    }


def command_line(
    events: Annotated[list[int] | None, typer.Option(
        help="events of one synthetic day, one run per size (repeatable) [default: 1000000, 10000000]")] = None,
    root: Annotated[Path, typer.Option()] = Path("/tmp/gem-bench"),
    master: Annotated[str, typer.Option()] = "local[2]",
    results_dir: ResultsDirOption = RESULTS_DIR,
) -> None:
    sizes = events or [1_000_000, 10_000_000]
    rows = [run_size(root / str(n), n, master) for n in sizes]
    print(f"{'events':>12} {'generate s':>11} {'ingest s':>9} {'ingest events/s':>16}")
    for r in rows:
        print(f"{int(r['events']):>12,} {r['generate_s']:>11.1f} {r['ingest_s']:>9.1f} {r['ingest_events_per_s']:>16,.0f}")
    shutil.rmtree(root, ignore_errors=True)
    figures = []
    for n, r in zip(sizes, rows, strict=True):  # keyed by the size asked for (lines ingested vary)
        figures += [
            Figure(f"events{n}_ingest_events_per_s", f"{n:,} events: ingest", round(r["ingest_events_per_s"]),
                   "events/s"),
            Figure(f"events{n}_ingest_s", f"{n:,} events: ingest, wall time", round(r["ingest_s"], 1), "s"),
            Figure(f"events{n}_generate_s", f"{n:,} events: the generator, wall time", round(r["generate_s"], 1), "s"),
        ]
    record("ingest_throughput", "Ingest throughput: one synthetic day generated, then ingested", figures,
           notes=f"Spark master {master}; each size in a fresh lakehouse.", results_dir=results_dir)


def main(argv: list[str] | None = None) -> int:
    app = job_app("python -m bench.ingest_throughput")
    app.command(help=__doc__)(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())
