"""List every stage's state per day: done, stale, missing (or - where the stage has nothing to do).

    python -m jobs.status [--start YYYY-MM-DD] [--end YYYY-MM-DD] [--config FILE]
    python -m jobs.status --registry      # the stage registry: each stage's day, needs and writes

Read from `_ops.completions` alone (no Spark). A stale record rests on data rewritten after it was
made (gem.lakehouse.staleness); under the grid, each stale record says what changed and what to rerun first.
Then, from the checkpoint root's promotion records (gem.train.promotion), the model each architecture
and student serves the last day with, and every day in the range whose trained model the promotion
gate refused (both NE figures; what stays in use) or that someone promoted by hand (`gem promote`).
Defaults: start_ds through the newest day any record names.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Annotated

import typer

from gem.config import GemConfig, load_config
from gem.days import day_range
from gem.lakehouse import stages
from gem.lakehouse.backfill_hold import live_holds
from gem.lakehouse.staleness import STALE, Ledger, all_records
from gem.pipeline.cli import DAY, ConfigOption, day_value, job_app, run_command
from gem.train.promotion import GATE, ROLLBACK, as_of, checkpoint_root, decisions, model_names

NOTHING_TO_DO = "-"


def has_work(cfg: GemConfig, name: str, ds: str) -> bool:
    """False where a skippable stage has nothing to do on ds (mix before any training day, and
    pretraining on such a day): its missing record is no gap."""
    stage = stages.stage(name)
    if not stage.skippable:
        return True
    for need in stage.needs:
        days = need.days(cfg, ds)
        if not days or any(need.stage != name and not has_work(cfg, need.stage, d) for d in days):
            return False
    return True


def grid(cfg: GemConfig, days: list[str]) -> tuple[list[str], list[str]]:
    """(the table's lines, one line per stale record saying why and what to rerun)."""
    ledger = Ledger(all_records(cfg))
    ledger.warm(ledger.records)
    names = [s.name for s in stages.RECORDED_STAGES]
    width = max(len(n) for n in names)
    lines = [f"{'stage':<{width}}  " + "  ".join(d[5:] for d in days)]  # MM-DD columns
    stale = []
    for name in names:
        cells = []
        for day in days:
            status = ledger.status(name, day)
            state = status.state if status.record_exists or has_work(cfg, name, day) else NOTHING_TO_DO
            cells.append(f"{state:<5}")
            if status.state == STALE:
                rerun = stages.command(*status.rerun_first) if status.rerun_first else stages.command(name, day)
                stale.append(f"{name} ds={day}: {status.why}; rerun `{rerun}` first")
        lines.append(f"{name:<{width}}  " + "  ".join(cells))
    return lines, stale


def promotion_lines(cfg: GemConfig, days: list[str]) -> list[str]:
    """Per promoted model (architecture or student): the model serving the last of `days`, then each
    decision of `days` that refused a model or was made by hand; [] when nothing was ever promoted."""
    root = checkpoint_root(cfg)
    names = model_names(root)
    if not names:
        return []
    width = max(len(n) for n in names)
    lines = [f"promoted models (serving {days[-1]}):"]
    for name in names:
        serving = as_of(root, name, days[-1])
        decided = (serving.decision or {}) if serving else {}
        source = f" (rolled back to {decided['model']['version']})" if decided.get("how") == ROLLBACK else ""
        lines.append(f"  {name:<{width}}  {serving.version + source if serving else 'none promoted yet'}")
        lines += [f"    {d.summary()}" for d in decisions(root, name)
                  if d.mix_ds in days and (not d.promoted or d.how != GATE)]
    return lines


def command_line(
    start: Annotated[str | None, typer.Option(help="first day (default: start_ds)", metavar=DAY, callback=day_value)] = None,
    end: Annotated[str | None, typer.Option(
        help="last day (default: the newest recorded)", metavar=DAY, callback=day_value)] = None,
    registry: Annotated[bool, typer.Option("--registry", help="print the stage registry and exit")] = False,
    config: ConfigOption = None,
) -> int:
    """Print every stage's state per day (done, stale, missing, or - where it has nothing to do),
    what each stale record needs rerun first, any running backfill, and the promoted models with
    each refused or hand-made promotion; or, with --registry, the
    stage registry: each stage's day, needs and writes."""
    if registry:
        rows = [("stage", "day", "needs", "writes", "runs")] + stages.describe()
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        print("\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows))
        return 0
    cfg = load_config(config)
    start = start or cfg.start_ds
    end = end or max((d for _, d in all_records(cfg)), default=start)
    if end < start:
        raise typer.BadParameter(f"{end} is before --start {start}", param_hint="--end")
    lines, stale = grid(cfg, day_range(start, end))
    print("\n".join(lines))
    if stale:
        print(f"\n{len(stale)} stale:")
        print("\n".join(f"  {line}" for line in stale))
    if promoted := promotion_lines(cfg, day_range(start, end)):
        print("\n" + "\n".join(promoted))
    for first, last, holder in live_holds(cfg):
        print(f"\nbackfill {first}..{last} running ({holder['run_id']}, pid {holder['pid']} on {holder['host']}, since "
              f"{holder['started_at']}): runs of later days that read it wait until it has finished")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    app = job_app("python -m jobs.status")
    app.command(help=__doc__.split("\n\n")[0])(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())
