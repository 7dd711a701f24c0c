"""Fault drills: kill each stage with SIGKILL at points spread over its run; check, rerun, compare.

    python -m drills.faults [--kills 20] [--stages ingest_events,pretrain] [--days 4] [--root DIR]

A small synthetic world (gem.sources.small_world.world_config, pretraining long enough to be killed between
steps and during its checkpoint saves, a sequence compaction on day N). Days 1 .. N-1 load through
the bulk path; day N is the day under test. For each stage, in the registry's order:
  before   the lakehouse as it stands when the stage's turn comes on day N (every earlier stage of
           day N done), saved aside;
  clean    the stage's job (`python -m jobs.<module> --ds N`, the command its Airflow task runs)
           run to the end on `before` twice (the first warms caches; both must leave the same
           rows): the second's wall time T and every table's rows;
  trial k  `before` restored, the job started again in its own process group and the group
           SIGKILLed at k / (kills + 1) x T (a job that ends first, on a machine whose load changed,
           is run again and killed at that share of the time it took; pretraining: two more trials
           killed inside a checkpoint save, at the named crash point `checkpoint:shards_written`: in
           the first save, and in the second, with a good checkpoint beside the half-written one).
           Then, before any rerun:
             * no reader sees partial data: every table's rows, per unit of commit (a partition
               day; a precompute shard within it), equal either `before`'s or the clean run's;
             * no completion record claims the day unless every table already equals the clean run's;
           then the job reruns to the end (its wall time is the recovery time) and every table must
           equal the clean run's (run ids, times, versions and paths aside: gem.lakehouse.compare's
           NOT_COMPARED); for pretraining also the per-step losses of the promoted checkpoint, bit
           for bit: training resumed from the killed run's last checkpoint exactly.
Prints per stage: trials, kills that landed before the job ended, survived, and the slowest recovery.
A drill of every stage (the default) publishes those figures through bench.results (fault_drill);
a drill of some stages only prints them.
Every table is read through its Delta log (gem.data.delta_log), as readers outside Spark read it.
tests/e2e/test_faults.py runs a small version (two stages, two kills each).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from bench.results import RESULTS_DIR, Figure, ResultsDirOption, record
from gem.command_line import job_app, run_command
from gem.config import load_config
from gem.data.delta_log import read_table
from gem.days import day_range, shift_day
from gem.faults import ENV_VAR as CRASH_ENV
from gem.lakehouse.compare import NOT_COMPARED
from gem.lakehouse.completions import completion
from gem.lakehouse.stages import RECORDED_STAGES, STAGES, command
from gem.sources.small_world import START_DS, world_config
from gem.train import checkpoint, promotion
from gem.train.daily import checkpoint_root
from schemas import TABLES

REPO_ROOT = Path(__file__).resolve().parents[1]
# Pretraining in the drill: enough steps and checkpoints that kills land between steps and saves.
TRAIN = {"steps": 24, "checkpoint_every": 6}
CHECKPOINT_SAVE = "checkpoint:shards_written"
# Rows of one unit of commit: (table, partition day, shard or None) -> sorted rows.
Units = dict[tuple[str, str, Any], list[tuple[str, ...]]]


@dataclass
class StageDrill:
    stage: str
    clean_s: float
    trials: int = 0
    landed: int = 0  # kills that came before the job ended (the others found it finished)
    survived: int = 0
    slowest_recovery_s: float = 0.0
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        """A row under TABLE_HEADER."""
        return (f"  {self.stage:<20} {self.trials:>6} {self.landed:>6} {self.survived:>8} "
                f"{self.slowest_recovery_s:>12.1f}s {self.clean_s:>9.1f}s")


RETRIES = 3  # a kill point that comes after its job ended is tried again this many times

TABLE_HEADER = f"{'stage':<20} {'trials':>6} {'landed':>6} {'survived':>8} {'slowest recovery':>13} {'clean run':>10}"


def drill_config(root: Path, days: int) -> Path:
    """gem.sources.small_world's world with the drill's pretraining (TRAIN) and a sequence compaction
    on the day under test (day `days`): every 2nd day when `days` is even, so that day also looks
    users up through the compaction before it; else every `days`-th day."""
    path = world_config(root)
    cfg = yaml.safe_load(path.read_text())
    cfg["train"] = {**cfg.get("train", {}), **TRAIN}
    cfg["sequence_compaction_days"] = 2 if days % 2 == 0 else days
    path.write_text(yaml.safe_dump(cfg))
    return path


def table_units(lakehouse: Path) -> Units:
    """Every table's rows under `lakehouse` (NOT_COMPARED columns dropped), grouped by unit of commit."""
    units: Units = defaultdict(list)
    for name, schema in TABLES.items():
        path = Path(schema.path(str(lakehouse)))
        if not (path / "_delta_log").is_dir():
            continue
        table = read_table(str(path))
        keep = [c for c in table.column_names if c not in NOT_COMPARED]
        for row in table.select(keep).to_pylist():
            units[(name, str(row.get("ds")), row.get("shard"))].append(tuple(repr(v) for v in row.values()))
    return {key: sorted(rows) for key, rows in units.items()}


def partial_units(now: Units, before: Units, clean: Units) -> list[str]:
    """The units of commit whose rows equal neither before's nor the clean run's."""
    return [f"{t} ds={ds}" + (f" shard={shard}" if shard is not None else "")
            for (t, ds, shard) in sorted(set(now) | set(before) | set(clean), key=str)
            if now.get((t, ds, shard)) not in (before.get((t, ds, shard)), clean.get((t, ds, shard)))]


def differing_tables(now: Units, clean: Units) -> list[str]:
    """The tables with a unit of commit whose rows differ from the clean run's."""
    return sorted({t for (t, ds, shard) in set(now) | set(clean) if now.get((t, ds, shard)) != clean.get((t, ds, shard))})


def recorded(cfg_path: Path, stage: str, ds: str, lakehouse: Path | None = None) -> bool:
    """Whether the config's lakehouse (or the copy at `lakehouse`) holds a completion record of (stage, ds)."""
    overrides = {"lakehouse_uri": str(lakehouse)} if lakehouse is not None else None
    return completion(load_config(str(cfg_path), overrides=overrides), stage, ds) is not None


def step_losses(cfg_path: Path, ds: str) -> list[Any] | None:
    """The per-step losses kept in the checkpoint pretraining promoted for ds (None: none promoted)."""
    cfg = load_config(str(cfg_path))
    promoted = promotion.of_day(checkpoint_root(cfg), cfg.model.arch, ds)
    return None if promoted is None else checkpoint.read_extra(promoted.checkpoint).get("losses")


def last_checkpoint_step(cfg_path: Path, ds: str) -> int | None:
    """The newest published checkpoint step of pretraining's run folder for ds (None: none yet)."""
    cfg = load_config(str(cfg_path))
    latest = checkpoint.latest(checkpoint.child(checkpoint_root(cfg), f"{cfg.model.arch}-{ds}"))
    return None if latest is None else int(checkpoint.read_extra(latest)["step"])


def job_env(cfg_path: Path, crash_at: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV and not k.startswith("GEM__")}
    env["GEM_CONFIG"] = str(cfg_path)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if crash_at:
        env[CRASH_ENV] = crash_at
    return env


def start(stage: str, ds: str, cfg_path: Path, log: Path, crash_at: str | None = None) -> subprocess.Popen[bytes]:
    """The stage's job for ds as its Airflow task's command runs it, in its own process group."""
    argv = command(stage, ds).split()[1:]  # "python -m jobs.x --ds D ..." without "python"
    out = open(log, "ab")  # noqa: SIM115 - handed to the child; closed with the process object
    return subprocess.Popen([sys.executable, *argv, "--config", str(cfg_path)], cwd=REPO_ROOT,
                            env=job_env(cfg_path, crash_at), stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def run_to_end(stage: str, ds: str, cfg_path: Path, log: Path) -> float:
    """Run the job to the end; -> its wall seconds. Raises when it failed (exit 99, nothing ready, is fine)."""
    t0 = time.monotonic()
    code = start(stage, ds, cfg_path, log).wait()
    if code not in (0, 99):
        raise RuntimeError(f"{stage} ds={ds} exited {code}; see {log}")
    return time.monotonic() - t0


def kill_group(proc: subprocess.Popen[bytes], after_s: float) -> float | None:
    """SIGKILL the job's process group `after_s` seconds after its start; -> None when it was
    killed, else the seconds it took to end on its own."""
    started = time.monotonic()
    try:
        proc.wait(timeout=after_s)
        return time.monotonic() - started
    except subprocess.TimeoutExpired:
        pass
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return None


def killed_at(stage: str, ds: str, cfg_path: Path, log: Path, lakehouse: Path, before_dir: Path, after_s: float,
              clean_s: float) -> tuple[bool, float]:
    """Start the job on `before` and SIGKILL it `after_s` into its run; -> (landed, when). A job that
    ends first ran faster than the clean run the point was timed on (the machine's load changes):
    it is started again and killed at the same share of the time it just took, up to RETRIES times."""
    share = after_s / clean_s
    for attempt in range(RETRIES + 1):
        if attempt:
            restore(before_dir, lakehouse)
        proc = start(stage, ds, cfg_path, log)
        ran_s = kill_group(proc, after_s)
        reap_group(proc)
        if ran_s is None:
            return True, after_s
        after_s = share * ran_s
    return False, after_s


def reap_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill whatever the job left in its process group (e.g. after it killed itself at a crash point)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def restore(snapshot: Path, lakehouse: Path) -> None:
    shutil.rmtree(lakehouse, ignore_errors=True)
    shutil.copytree(snapshot, lakehouse, symlinks=True)


def prepare(root: Path, days: list[str], log: Path) -> Path:
    """The drill's world with days[:-1] loaded through the bulk path; -> its config."""
    cfg_path = drill_config(root / "world", len(days))
    with open(log, "ab") as out:
        subprocess.run([sys.executable, "-m", "gem.pipeline.bulk", "--start", days[0], "--end", days[-2],
                        "--config", str(cfg_path)], cwd=REPO_ROOT, env=job_env(cfg_path), stdout=out,
                       stderr=subprocess.STDOUT, check=True)
    return cfg_path


def drill_stage(stage: str, ds: str, cfg_path: Path, lakehouse: Path, snapshots: Path, kills: int,
                log: Path) -> StageDrill:
    """The clean run and the kill trials of one stage; leaves the lakehouse as the clean run left it."""
    before_dir = snapshots / f"{stage}-before"
    shutil.copytree(lakehouse, before_dir, symlinks=True)
    before = table_units(lakehouse)
    # Two clean runs: the first warms the caches a cold machine would make it slow on, so the kill
    # points spread over the second's wall time land over the whole of the trials' runs; the two
    # must agree (a stage is deterministic, or no rerun could equal its first run).
    warm_up = run_to_end(stage, ds, cfg_path, log)
    first = table_units(lakehouse)
    restore(before_dir, lakehouse)
    clean_s = run_to_end(stage, ds, cfg_path, log)
    clean, clean_losses = table_units(lakehouse), step_losses(cfg_path, ds) if stage == "pretrain" else None
    clean_dir = snapshots / f"{stage}-clean"
    shutil.copytree(lakehouse, clean_dir, symlinks=True)
    drill = StageDrill(stage, clean_s)
    drill.failures += [f"{stage}: two clean runs differ in {t}" for t in differing_tables(first, clean)]
    print(f"    clean runs {warm_up:.1f}s and {clean_s:.1f}s{'' if not drill.failures else ': they differ'}", flush=True)
    trials = [(clean_s * k / (kills + 1), None) for k in range(1, kills + 1)]
    if stage == "pretrain":  # killed by its own crash point: in the first save, and in the second
        trials += [(clean_s * 10, CHECKPOINT_SAVE), (clean_s * 10, f"{CHECKPOINT_SAVE}@2")]
    for after_s, crash_at in trials:
        restore(before_dir, lakehouse)
        drill.trials += 1
        if crash_at is None:
            landed, after_s = killed_at(stage, ds, cfg_path, log, lakehouse, before_dir, after_s, clean_s)
        else:  # the job kills itself at its crash point
            proc = start(stage, ds, cfg_path, log, crash_at)
            kill_group(proc, after_s)
            reap_group(proc)
            landed = proc.returncode == -signal.SIGKILL
        drill.landed += landed
        what = f"{stage} killed at {after_s:.1f}s" if crash_at is None else f"{stage} killed at {crash_at}"
        if stage == "pretrain":
            what += f" (resumable from step {last_checkpoint_step(cfg_path, ds) or 0})"
        killed = table_units(lakehouse)
        problems = [f"{what}: partial {unit}" for unit in partial_units(killed, before, clean)]
        if recorded(cfg_path, stage, ds) and killed != clean:
            problems.append(f"{what}: a completion record claims day {ds} before its tables are complete")
        t0 = time.monotonic()
        try:
            run_to_end(stage, ds, cfg_path, log)
        except RuntimeError as e:
            problems.append(f"{what}: the rerun failed: {e}")
        drill.slowest_recovery_s = max(drill.slowest_recovery_s, time.monotonic() - t0)
        if not problems:
            problems += [f"{what}: after the rerun {t} differs from the clean run"
                         for t in differing_tables(table_units(lakehouse), clean)]
            if not recorded(cfg_path, stage, ds) and recorded(cfg_path, stage, ds, clean_dir):
                problems.append(f"{what}: the rerun published no completion record")
            if stage == "pretrain" and step_losses(cfg_path, ds) != clean_losses:
                problems.append(f"{what}: the resumed training's per-step losses differ from the clean run's")
        drill.survived += not problems
        drill.failures += problems
        print(f"    {what}: {'landed' if landed else 'job had ended'}; "
              f"{'survived' if not problems else '; '.join(problems)}", flush=True)
    restore(clean_dir, lakehouse)
    return drill


def command_line(
    kills: Annotated[int, typer.Option(min=1, help="kill points per stage, spread over its run")] = 20,
    stages: Annotated[str, typer.Option(
        help="comma-separated stages to drill (default: every stage that writes or checks a table)",
        show_default=False)] = ",".join(s.name for s in RECORDED_STAGES),
    day_count: Annotated[int, typer.Option("--days", min=2, help="the day under test is the last of this many")] = 4,
    root: Annotated[Path | None, typer.Option(help="working folder (default: a temporary one, removed)")] = None,
    results_dir: ResultsDirOption = RESULTS_DIR,
) -> int:
    names = [s.name for s in STAGES]
    chosen = [s.strip() for s in stages.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        raise typer.BadParameter(f"unknown stages {unknown}; stages: {', '.join(names)}", param_hint="--stages")
    days = day_range(START_DS, shift_day(START_DS, day_count - 1))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gem-faults-") as tmp:
        root = root or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        log = root / "jobs.log"
        print(f"fault drill: days {days[0]}..{days[-1]}, day under test {days[-1]}, {kills} kills per "
              f"stage; the jobs' output: {log}", flush=True)
        cfg_path = prepare(root, days, log)
        lakehouse = Path(yaml.safe_load(cfg_path.read_text())["lakehouse_uri"])
        snapshots = root / "snapshots"
        snapshots.mkdir(exist_ok=True)
        drills = []
        for name in names:  # registry order: each stage finds every earlier one done
            if name in chosen:
                print(f"  {name}:", flush=True)
                drills.append(drill_stage(name, days[-1], cfg_path, lakehouse, snapshots, kills, log))
                # The stage's figures as soon as it is done: a drill stopped later keeps them.
                print(f"  {name} done: " + drills[-1].line().strip(), flush=True)
            else:
                run_to_end(name, days[-1], cfg_path, log)
        print(f"\n  {TABLE_HEADER}")
        for d in drills:
            print(d.line())
        failed = [f for d in drills for f in d.failures]
        print("all survived" if not failed else f"{len(failed)} problems:\n  " + "\n  ".join(failed))
    if set(chosen) == {s.name for s in RECORDED_STAGES}:
        publish(drills, len(failed), kills, day_count, time.monotonic() - started, results_dir)
    return 0 if not failed else 1


def main(argv: list[str] | None = None) -> int:
    app = job_app("python -m drills.faults")
    app.command(help=__doc__.splitlines()[0])(command_line)
    return run_command(app, argv)


def publish(drills: list[StageDrill], problems: int, kills: int, day_count: int, wall_s: float,
            results_dir: Path) -> None:
    """The drill's totals as its published result, each stage's row in `extra`."""
    slowest = max(drills, key=lambda d: d.slowest_recovery_s)
    figures = [
        Figure("stages", "stages drilled", len(drills)),
        Figure("trials", "kill trials, all stages", sum(d.trials for d in drills)),
        Figure("landed", "kills that landed before the job ended", sum(d.landed for d in drills)),
        Figure("survived", "trials survived (nothing partial, no early record, rerun equal to the clean run)",
               sum(d.survived for d in drills)),
        Figure("problems", "problems found", problems),
        Figure("slowest_recovery_s", f"slowest recovery (rerun after a kill; {slowest.stage})",
               round(slowest.slowest_recovery_s, 1), "s"),
        Figure("wall_s", "the whole drill, wall time", round(wall_s), "s"),
    ]
    per_stage = {d.stage: {"trials": d.trials, "landed": d.landed, "survived": d.survived,
                           "slowest_recovery_s": round(d.slowest_recovery_s, 1), "clean_s": round(d.clean_s, 1)}
                 for d in drills}
    record("fault_drill", "Fault drill: every stage killed with SIGKILL mid-run, rerun, compared", figures,
           notes=f"{kills} kill points per stage over {day_count} days (the last one under test); pretraining "
                 "also killed inside its first and second checkpoint save.",
           extra={"stages": per_stage}, results_dir=results_dir)


if __name__ == "__main__":
    sys.exit(main())
