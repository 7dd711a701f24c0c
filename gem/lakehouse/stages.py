"""The stage registry: every stage of the daily pipeline, declared once.

A stage is a job (`python -m jobs.<module>`) that processes one day and publishes one completion
record per day it completes. Its declaration says:

- which day it processes on a run day R: R itself (`--ds R`), or the impression day whose
  attribution window closes on R (`--ready-on R`, ds = R - attribution_window_days);
- the completion records it needs before it may start, as (stage, days relative to its ds);
- whether it needs Spark (torch stages commit and publish without starting a JVM);
- per table, the partitions it writes (days relative to its ds, or on a schedule).

dags/gem_daily.py builds its tasks and dependencies from this registry; every job commits through
`gem.lakehouse.commit.StageCommit`, which checks the needs before anything is written and refuses a write
the declaration does not name; tests/dags/test_dag_integrity.py compares the parsed DAG with both the
registry and a hand-written expected graph. Adding a stage means: a declaration here, its job, its
tests.

Imported by the DAG processor on every parse: standard library only.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gem.days import day_range, shift_day
from schemas.features import WINDOW_DAYS

if TYPE_CHECKING:
    from gem.config import GemConfig

# A day rule: (config, the stage's ds) -> the days it names, oldest first.
DayRule = Callable[["GemConfig", str], list[str]]


def _span(cfg: GemConfig, first: str, last: str) -> list[str]:
    """Days first..last inclusive, none before the pipeline's start_ds."""
    return day_range(max(first, cfg.start_ds), last)


# --- Day rules, named for what they mean. ---------------------------------------------------------


def same_day(cfg: GemConfig, ds: str) -> list[str]:
    """ds itself."""
    return [ds]


def previous_day(cfg: GemConfig, ds: str) -> list[str]:
    """ds - 1, from the day after start_ds on (the first day has no previous one)."""
    return _span(cfg, shift_day(ds, -1), shift_day(ds, -1))


def feature_window_days(cfg: GemConfig, ds: str) -> list[str]:
    """The arrival days the counters of ds cover: the longest feature window, ds-28 .. ds-1. The
    daily build rewrites only ds-1's daily counts; a full rebuild rewrites them all."""
    return _span(cfg, shift_day(ds, -max(WINDOW_DAYS)), shift_day(ds, -1))


def examples_bronze_days(cfg: GemConfig, ds: str) -> list[str]:
    """The arrival days the examples of impression day ds read, with W = attribution_window_days:
    ds-2W-1 .. ds+W (a conversion arriving by ds+W may follow a click up to W days before it, whose
    impression may have arrived up to W+1 days before that click)."""
    w = cfg.attribution_window_days
    return _span(cfg, shift_day(ds, -2 * w - 1), shift_day(ds, w))


def mixed_days(cfg: GemConfig, ds: str) -> list[str]:
    """The example days the mixture of run day ds reads, oldest first: up to mix.train_days
    training days (none of the pipeline's first mix.cold_start_days), the mix.validation_days
    validation days, then the held-out day ds - attribution_window_days (the newest day whose window
    has closed). jobs.mix splits them."""
    held_out = shift_day(ds, -cfg.attribution_window_days)
    first_validation = shift_day(held_out, -cfg.mix.validation_days)
    first_trainable = shift_day(cfg.start_ds, cfg.mix.cold_start_days)
    if first_validation <= first_trainable:  # no training day before them: nothing is mixed (the job exits 99)
        return []
    return day_range(max(shift_day(first_validation, -cfg.mix.train_days), first_trainable), held_out)


def held_out_day(cfg: GemConfig, ds: str) -> list[str]:
    """The held-out example day of run day ds's mixture: ds - attribution_window_days, the newest
    day whose window has closed (none before start_ds)."""
    return _span(cfg, shift_day(ds, -cfg.attribution_window_days), shift_day(ds, -cfg.attribution_window_days))


def compaction_days(cfg: GemConfig, ds: str) -> list[str]:
    """ds when it is a compaction day: every sequence_compaction_days-th day counted from start_ds
    (its last day, so a compaction folds in a full period); none otherwise."""
    k = cfg.sequence_compaction_days
    since = (dt.date.fromisoformat(ds) - dt.date.fromisoformat(cfg.start_ds)).days
    return [ds] if k > 0 and since >= 0 and since % k == k - 1 else []


def ready_on_day(cfg: GemConfig, run_day: str) -> str | None:
    """The impression day whose attribution window closes on run_day; None before any has."""
    ds = shift_day(run_day, -cfg.attribution_window_days)
    return ds if ds >= cfg.start_ds else None


# --- Declarations. --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Need:
    """Completion records of `stage` for the days `days(cfg, ds)` must exist before the stage runs."""

    stage: str
    days: DayRule = same_day


@dataclass(frozen=True)
class Writes:
    """The partitions (`ds` values) of `table` one run of the stage may replace (gem.lakehouse.commit refuses
    any other); a run may replace fewer, e.g. build_features' daily run rewrites only ds-1's counts."""

    table: str
    days: DayRule = same_day


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline (see the module docstring).

    module/extra_args: the job it runs, `python -m jobs.<module> <day flag> <day> <extra_args>`.
    ready_on: the job takes `--ready-on R` and processes ds = R - attribution_window_days; it
        exits 99 (the task shows as skipped) when no window has closed on R yet.
    skippable: exit 99 means "nothing to do yet" (always true for ready_on stages).
    after: DAG order that no completion record expresses (the landing files of generate_events).
    pool: the Airflow pool its task queues in (None: the default pool).
    ranges: one run may cover a range of days in one commit, publishing one record per day
        (`--ds D1 --through D2`, e.g. a backfill of bronze from landing).
    entry: the job module's function `entry(ctx, ds) -> StageResult` its command line calls, which
        the bulk path (gem.pipeline.bulk) calls in-process.
    records: the stage publishes a completion record per day (False for a source: generate_events
        marks its landing partitions with `_SUCCESS` instead), so status listings and the run report
        show it only when it does.
    """

    name: str
    module: str
    needs: tuple[Need, ...] = ()
    writes: tuple[Writes, ...] = ()
    spark: bool = True
    ready_on: bool = False
    skippable: bool = False
    after: tuple[str, ...] = ()
    extra_args: str = ""
    pool: str | None = None
    ranges: bool = False
    entry: str = "run"
    records: bool = True
    doc: str = ""

    def ds(self, cfg: GemConfig, run_day: str) -> str | None:
        """The day this stage processes on run day `run_day`; None when nothing is ready yet."""
        return ready_on_day(cfg, run_day) if self.ready_on else run_day

    def needed(self, cfg: GemConfig, ds: str) -> list[tuple[str, str]]:
        """(stage, day) of every completion record the run of ds needs, in declaration order."""
        return [(need.stage, day) for need in self.needs for day in need.days(cfg, ds)]

    @property
    def carries_state(self) -> bool:
        """True when the stage needs its own record of an earlier day (day-over-day state, e.g.
        build_sequences advancing yesterday's sequences): its run of D waits for its run of D-1."""
        return any(n.stage == self.name for n in self.needs)

    @property
    def reads_landing(self) -> bool:
        """True when the stage needs landing partitions (their `_SUCCESS` markers)."""
        return any(n.stage == LANDING for n in self.needs)

    def landing_days(self, cfg: GemConfig, ds: str) -> list[str]:
        """The landing partitions (arrival days) the run of ds reads."""
        return [d for n in self.needs if n.stage == LANDING for d in n.days(cfg, ds)]

    def partitions(self, cfg: GemConfig, ds: str) -> dict[str, list[str]]:
        """table -> the partitions the run of ds replaces (tables with none that day left out)."""
        return {w.table: days for w in self.writes if (days := w.days(cfg, ds))}


GPU_POOL = "gpu"
# A need of this "stage" is a landing partition: met by the `_SUCCESS` marker its producer (the
# generator, the MovieLens import, a real export) writes last; it creates no DAG edge (`after` does).
LANDING = "landing"

STAGES: tuple[Stage, ...] = (
    # skippable: with `source: landing` the generator has nothing to do (exit 99) and the landing
    # files come from an export or the MovieLens import.
    Stage("generate_events", "generate_events", spark=False, skippable=True, records=False,
          doc="the synthetic world's gzipped JSON-lines landing files of ds (a source, not a table); "
              "skipped unless the config's source is `synthetic`"),
    Stage("ingest_events", "ingest_events", after=("generate_events",), needs=(Need(LANDING),), ranges=True,
          writes=(Writes("bronze.ad_events"), Writes("bronze.quarantine")),
          doc="landing -> typed, deduplicated bronze; bad lines quarantined with a reason"),
    Stage("validate_events", "validate_events", needs=(Need("ingest_events"),), ranges=True,
          doc="Great Expectations on bronze ds and its quarantine"),
    Stage("build_sequences", "build_sequences", ranges=True,
          needs=(Need("validate_events"), Need("build_sequences", previous_day)),
          writes=(Writes("silver.user_sequences"), Writes("silver.user_sequences_compacted", compaction_days)),
          doc="each active user's lifelong sequences, advanced by one day; compacted on schedule"),
    Stage("build_features", "build_features", ranges=True,
          needs=(Need("validate_events", feature_window_days),),
          writes=(Writes("silver.user_daily_counts", feature_window_days),
                  Writes("silver.ad_daily_counts", feature_window_days),
                  Writes("silver.user_features"), Writes("silver.ad_features")),
          doc="point-in-time counters as of the end of ds-1 (ds-1's daily counts added; --full: the window's)"),
    Stage("validate_silver", "validate_silver", entry="run_tables", ranges=True, needs=(Need("build_sequences"), Need("build_features")),
          doc="Great Expectations on ds's sequences and features"),
    Stage("assemble_examples", "assemble_examples", ready_on=True, ranges=True,
          needs=(Need("validate_events", examples_bronze_days), Need("validate_silver")),
          writes=(Writes("silver.training_examples"), Writes("silver.attribution_quarantine"),
                  Writes("silver.click_quarantine")),
          doc="one labelled example per impression of ds, once its attribution window has closed"),
    Stage("validate_examples", "validate_silver", extra_args="--examples", ready_on=True, entry="run_examples", ranges=True,
          needs=(Need("assemble_examples"),),
          doc="Great Expectations on ds's training examples"),
    Stage("mix", "mix", spark=False, skippable=True,
          needs=(Need("validate_examples", mixed_days), Need("validate_silver", mixed_days)),
          writes=(Writes("gold.mixture_manifest"),),
          doc="the training mixture over the closed example days: a manifest of files, no data copied"),
    Stage("pretrain", "pretrain", spark=False, skippable=True, pool=GPU_POOL, needs=(Need("mix"),),
          writes=(Writes("gold.metrics"),),
          doc="continued pretraining on ds's mixture; held-out metrics; promotes the model"),
    # A Spark stage: its shards run as tasks on the session's executors, which hold the GPUs it asks
    # for (precompute.gpus_per_task), so it queues in no Airflow pool of its own.
    Stage("precompute", "precompute", skippable=True,
          needs=(Need("pretrain"), Need("validate_silver"), Need("validate_examples", held_out_day)),
          writes=(Writes("gold.fm_user_embeddings"), Writes("gold.fm_predictions", held_out_day),
                  Writes("gold.fm_history_codes", held_out_day),
                  Writes("gold.fm_speculative_pairs"), Writes("gold.precompute_stats")),
          doc="Solaris: user embeddings (incremental), predictions for the held-out day's impressions, "
              "speculative pairs for ds+1 and the measured use of ds-1's, one Spark task per user-hash shard"),
    # Also reads precompute and the validations of the previous held-out day (its training day),
    # noted when it runs: on the first days there is none and the stage skips.
    Stage("distill", "distill", spark=False, skippable=True, pool=GPU_POOL,
          needs=(Need("precompute"), Need("validate_examples", held_out_day), Need("validate_silver", held_out_day)),
          writes=(Writes("gold.metrics"),),
          doc="per-surface students trained on the FM's logged predictions and history codes (ExFM, "
              "LoopFM), scored on the held-out day beside the FM, promoted"),
)

REGISTRY: Mapping[str, Stage] = {s.name: s for s in STAGES}
# The stages that publish a completion record per day: all but the source (generate_events).
RECORDED_STAGES: tuple[Stage, ...] = tuple(s for s in STAGES if s.records)


def stage(name: str) -> Stage:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"no stage {name!r} in the registry; stages: {', '.join(REGISTRY)}") from None


def upstream(name: str) -> set[str]:
    """The stages a stage's task waits for within one DAG run: the producers of its needs and its
    `after`, minus edges another path already implies (a transitive reduction), so the drawn graph
    shows each dependency once."""
    direct = _direct_upstream()
    reachable = {s: _ancestors(s, direct) for s in REGISTRY}
    mine = direct[name]
    return {u for u in mine if not any(u in reachable[v] for v in mine if v != u)}


def _direct_upstream() -> dict[str, set[str]]:
    return {
        # A stage's own earlier days are not an edge; a landing need is met outside the DAG's stages.
        s.name: ({n.stage for n in s.needs} | set(s.after)) - {s.name, LANDING}
        for s in STAGES
    }


def _ancestors(name: str, direct: Mapping[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    todo = list(direct[name])
    while todo:
        u = todo.pop()
        if u not in seen:
            seen.add(u)
            todo.extend(direct[u])
    return seen


def missing_inputs(name: str, cfg: GemConfig, ds: str,
                   completed: Callable[[str, str], Any]) -> list[tuple[str, str]]:
    """(stage, day) of each needed record that `completed(stage, day)` does not return."""
    return [(s, d) for s, d in stage(name).needed(cfg, ds) if completed(s, d) is None]


def describe_missing(name: str, ds: str, missing: list[tuple[str, str]]) -> str:
    """A message that names what to run first, e.g. "assemble_examples ds=2026-01-03 needs records
    that do not exist yet: validate_events ds=2026-01-05; run `python -m jobs.validate_events --ds 2026-01-05` first"."""
    listed = ", ".join(f"{s} ds={d}" + (" (no _SUCCESS marker)" if s == LANDING else "") for s, d in missing)
    return f"{name} ds={ds} needs records that do not exist yet: {listed}; run `{command(*missing[0])}` first"


def command(name: str, ds: str) -> str:
    """The command that runs one stage for one day, e.g. `python -m jobs.validate_silver --ds D --examples`."""
    if name == LANDING:
        return f"python -m jobs.generate_events --ds {ds}"  # or the MovieLens import, or a real export
    st = stage(name)
    return " ".join(filter(None, (f"python -m jobs.{st.module} --ds {ds}", st.extra_args)))


def describe() -> list[tuple[str, str, str, str, str]]:
    """The registry as rows (stage, day, needs, writes, runs on), day rules by name, e.g.
    ("build_features", "ds", "validate_events[feature_window_days]", "silver.user_daily_counts[...], ...", "spark")."""
    def rule(days: DayRule) -> str:
        return "" if days is same_day else f"[{days.__name__}]"

    rows = []
    for s in STAGES:
        day = "R - attribution_window_days" if s.ready_on else "ds"
        needs = ", ".join(f"{n.stage}{rule(n.days)}" for n in s.needs) or "-"
        if s.after:
            needs += f" (after {', '.join(s.after)})"
        writes = ", ".join(f"{w.table}{rule(w.days)}" for w in s.writes) or "-"
        runs = ("spark" if s.spark else "no JVM") + (", ranges" if s.ranges else "") + (f", pool {s.pool}" if s.pool else "")
        rows.append((s.name, day, needs, writes, runs))
    return rows
