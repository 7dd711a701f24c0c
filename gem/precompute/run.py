"""One precompute day, the `precompute` stage's entry point (jobs.precompute is its command line).

    StageCommit.begin          inputs checked (pretrain, validate_silver of ds, validate_examples of
                               the held-out day), the day's record withdrawn, the day's lease taken
    plan                       model (refresh or pinned), users, input versions, popular ads (gem.precompute.plan)
    shards                     one Spark task per shard on the session's executors; each commits its
                               shard's rows of the four tables itself (gem.precompute.executors)
    stats, record              the parts adopted into the record (rows from the commits' metrics,
                               checked against the tasks' reports; one prediction per held-out
                               impression checked), the observed use of yesterday's speculative
                               pairs, gold.precompute_stats, the record last

Skip or fail: the stage skips (nothing published; the job exits 99) when ds has no mixture, i.e.
pretraining itself had nothing to train on and skipped (the pipeline's first days). Once there is a
mixture, everything is required: a missing pretrain record is a MissingInputError naming it, and a
pretrain record without a promoted model fails with PromotedModelMissing.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pyarrow as pa

from gem.data.delta_log import logged_files, read_logged, read_table
from gem.days import shift_day
from gem.lakehouse import completions, tables
from gem.lakehouse.commit import ReconciliationError, StageCommit, StageContext, StageResult
from gem.precompute import speculative
from gem.precompute.executors import run_shards
from gem.precompute.plan import STAGE, DayPlan, TableAt, choose_model, examples_day, sequence_days
from schemas.examples import SILVER_TRAINING_EXAMPLES
from schemas.features import SILVER_AD_FEATURES, SILVER_USER_FEATURES
from schemas.precompute import (
    GOLD_FM_HISTORY_CODES,
    GOLD_FM_PREDICTIONS,
    GOLD_FM_SPECULATIVE_PAIRS,
    GOLD_FM_USER_EMBEDDINGS,
    GOLD_PRECOMPUTE_STATS,
    PRECOMPUTE_TABLES,
)
from schemas.sequences import SILVER_USER_SEQUENCES

NO_INPUT_COUNT = ("precompute: embeddings of the users recomputed, one prediction per held-out impression "
                  "(checked against the examples' rows), the speculative pairs, one stats row")


def plan_day(commit: StageCommit) -> DayPlan:
    """Decide the day's work (gem.precompute.plan) from the inputs `commit` checked."""
    cfg, ds = commit.cfg, commit.ds
    pin, previous = choose_model(cfg, ds)
    refreshed = pin.refresh_ds == ds
    if previous is not None:  # an input: rerunning that day makes this one stale (gem.lakehouse.staleness)
        commit.also_needs(STAGE, previous.ds)
    sequences = TableAt(tables.table_path(cfg, SILVER_USER_SEQUENCES),
                        commit.validated_version(SILVER_USER_SEQUENCES, "validate_silver", [ds]))
    user_features = TableAt(tables.table_path(cfg, SILVER_USER_FEATURES),
                            commit.validated_version(SILVER_USER_FEATURES, "validate_silver", [ds]))
    ad_features = TableAt(tables.table_path(cfg, SILVER_AD_FEATURES),
                          commit.validated_version(SILVER_AD_FEATURES, "validate_silver", [ds]))
    held_out = examples_day(cfg, ds)
    examples = None if held_out is None else TableAt(
        tables.table_path(cfg, SILVER_TRAINING_EXAMPLES),
        commit.validated_version(SILVER_TRAINING_EXAMPLES, "validate_examples", [held_out]))
    files = logged_files(sequences.path, sequences.version)
    impressions = impressions_on(files, ds)
    versions = {SILVER_USER_SEQUENCES.name: sequences.version, SILVER_USER_FEATURES.name: user_features.version,
                SILVER_AD_FEATURES.name: ad_features.version}
    if examples is not None:
        versions[SILVER_TRAINING_EXAMPLES.name] = examples.version
    return DayPlan(
        ds=ds, run_id=commit.run_id, shards=cfg.precompute.shards, model=pin, refreshed=refreshed,
        since_ds=None if refreshed else previous.ds,
        sequence_days=sequence_days(cfg, ds, None if refreshed else previous.ds, {f.partition["ds"] for f in files}),
        examples_ds=held_out, sequences=sequences, user_features=user_features, ad_features=ad_features,
        examples=examples, popular_ads=speculative.popular_ads(impressions, cfg.precompute.popular_ads),
        input_versions=versions, config=cfg.to_dict(),
    )


def impressions_on(files: list[Any], ds: str) -> pa.Table:
    """(user_id, ad_id) of the impressions that arrived on ds with an event time on ds, from the
    silver.user_sequences partition ds among `files` (LoggedFile)."""
    today = [f for f in files if f.partition["ds"] == ds]
    if not today:
        return pa.table({"user_id": pa.array([], pa.string()), "ad_id": pa.array([], pa.string())})
    return speculative.day_impressions(read_logged(today, {}, ["user_id", "impressions"]), ds)


def run(ctx: StageContext, ds: str) -> StageResult:
    """Precompute day ds (module docstring) on the Spark session of `ctx`. Nothing published when ds
    has no mixture (pretraining skipped)."""
    t0, cfg = time.time(), ctx.cfg
    if completions.completion(cfg, "mix", ds) is None:
        print(f"precompute ds={ds}: pretraining had no mixture for {ds} and skipped; nothing to precompute yet")
        return StageResult(STAGE, ds, 0.0)
    commit = StageCommit.begin(ctx, STAGE, ds)
    plan = plan_day(commit)
    for schema in (*PRECOMPUTE_TABLES, GOLD_PRECOMPUTE_STATS):  # created once, before the tasks race to
        tables.ensure_table(None, cfg, schema)
    reports = run_shards(ctx.spark_for(STAGE, ds), plan)
    return finish_day(commit, plan, reports, t0)


def finish_day(commit: StageCommit, plan: DayPlan, reports: list[dict[str, Any]], started: float) -> StageResult:
    """Once every shard's task has reported: adopt the parts, check them against the reports and
    one prediction per example, write the day's stats and publish the record."""
    done = sorted(r["shard"] for r in reports)
    if done != list(range(plan.shards)):
        raise ReconciliationError(f"precompute ds={plan.ds}: reports of shards {done}, expected 0..{plan.shards - 1}")
    parts = [str(s) for s in range(plan.shards)]
    for schema in PRECOMPUTE_TABLES:
        commit.adopt_parts(schema, parts)
        reported = sum(r["rows"][schema.name] for r in reports)
        if commit.committed_rows[schema.name] != reported:
            raise ReconciliationError(f"precompute ds={plan.ds}: {schema.name}'s part commits hold "
                                      f"{commit.committed_rows[schema.name]} rows, the tasks reported {reported}")
    expected = _examples_rows(plan)
    if commit.committed_rows[GOLD_FM_PREDICTIONS.name] != expected:
        raise ReconciliationError(f"precompute ds={plan.ds}: {commit.committed_rows[GOLD_FM_PREDICTIONS.name]} "
                                  f"predictions for {expected} examples of {plan.examples_ds}")
    if commit.committed_rows[GOLD_FM_HISTORY_CODES.name] not in (0, expected):  # 0: the model codes nothing
        raise ReconciliationError(f"precompute ds={plan.ds}: {commit.committed_rows[GOLD_FM_HISTORY_CODES.name]} "
                                  f"history codes for {expected} examples of {plan.examples_ds}")
    stats = day_stats(commit, plan)
    commit.replace_arrow(pa.Table.from_pylist([stats], GOLD_PRECOMPUTE_STATS.arrow_schema()), GOLD_PRECOMPUTE_STATS)
    commit.publish(None, written_tables=(*PRECOMPUTE_TABLES, GOLD_PRECOMPUTE_STATS), no_input_count=NO_INPUT_COUNT)
    figures = {k: stats[k] for k in ("refreshed", "users_total", "users_computed", "users_carried", "predictions",
                                     "history_codes", "history_code_bytes_per_user",
                                     "speculative_pairs", "hit_rate", "wasted_share", "model_age_days",
                                     "input_age_days")}
    workers, devices = {r["worker"] for r in reports}, sorted({r["device"] for r in reports})
    print(f"precompute ds={plan.ds}: {plan.shards} shard tasks in {len(workers)} Python worker(s) on "
          f"{', '.join(devices)}; the model loaded {sum(r['loaded_model'] for r in reports)} time(s)")
    phases = {p: sum(r["seconds"][p] for r in reports) for p in reports[0]["seconds"]}
    window = max(r["finished"] for r in reports) - min(r["started"] for r in reports)
    return commit.result(started, model_version=plan.model.version, **figures, shard_seconds=phases,
                         shards_window_s=window, python_workers=len(workers), devices=devices,
                         model_loads=sum(r["loaded_model"] for r in reports))


def _examples_rows(plan: DayPlan) -> int:
    if plan.examples is None:
        return 0
    return sum(f.rows for f in logged_files(plan.examples.path, plan.examples.version)
               if f.partition["ds"] == plan.examples_ds)


def history_code_volume(commit: StageCommit, plan: DayPlan) -> dict[str, Any]:
    """gold.fm_history_codes' rows of the held-out day and the bytes they store per coded user
    (LoopFM's storage cost per user per day: packed codes only, no stamps)."""
    rows = commit.committed_rows[GOLD_FM_HISTORY_CODES.name]
    if not rows or plan.examples_ds is None:
        return {"history_codes": rows, "history_code_bytes_per_user": None}
    coded = read_table(tables.table_path(commit.cfg, GOLD_FM_HISTORY_CODES), columns=["user_id"],
                       where={"ds": plan.examples_ds})
    users = len(set(coded["user_id"].to_pylist()))
    code_bytes = commit.cfg.model.history_codes.code_dim // 2  # every code packs to the same width
    return {"history_codes": rows, "history_code_bytes_per_user": rows * code_bytes / max(users, 1)}


def day_stats(commit: StageCommit, plan: DayPlan) -> dict[str, Any]:
    """gem.precompute_stats' row of the day: the work done and the observed use of yesterday's pairs."""
    cfg, ds = commit.cfg, commit.ds
    files = logged_files(plan.sequences.path, plan.sequences.version)
    universe: set[str] = set()
    for day in sorted({f.partition["ds"] for f in files if f.partition["ds"] <= ds}):
        universe.update(read_logged([f for f in files if f.partition["ds"] == day], {}, ["user_id"])["user_id"].to_pylist())
    computed = commit.committed_rows[GOLD_FM_USER_EMBEDDINGS.name]
    row: dict[str, Any] = {
        "ds": dt.date.fromisoformat(ds), "run_id": commit.run_id, "model_version": plan.model.version,
        "model_checkpoint": plan.model.checkpoint, "model_ds": dt.date.fromisoformat(plan.model.model_ds),
        "refresh_ds": dt.date.fromisoformat(plan.model.refresh_ds), "refreshed": plan.refreshed,
        "shards": plan.shards, "users_total": len(universe), "users_computed": computed,
        "users_carried": len(universe) - computed,
        "predictions": commit.committed_rows[GOLD_FM_PREDICTIONS.name],
        **history_code_volume(commit, plan),
        "speculative_pairs": commit.committed_rows[GOLD_FM_SPECULATIVE_PAIRS.name],
        "measured_ds": None, "impressions": None, "hits": None, "hit_rate": None, "wasted_share": None,
        "model_age_days": None, "input_age_days": None,
    }
    yesterday = shift_day(ds, -1)
    if completions.completion(cfg, STAGE, yesterday) is None:  # no pairs were precomputed for today
        return row
    record = commit.also_needs(STAGE, yesterday)  # its pairs are read: noted as an input
    pairs_version = record["table_versions"][GOLD_FM_SPECULATIVE_PAIRS.name]
    pairs = read_table(tables.table_path(cfg, GOLD_FM_SPECULATIVE_PAIRS), pairs_version,
                       columns=["user_id", "ad_id", "sequence_ds"], where={"ds": yesterday})
    stats_version = record["table_versions"][GOLD_PRECOMPUTE_STATS.name]
    (previous,) = read_table(tables.table_path(cfg, GOLD_PRECOMPUTE_STATS), stats_version,
                             columns=["model_ds"], where={"ds": yesterday}).to_pylist()
    measured = speculative.measure(impressions_on(files, ds), pairs, ds)
    return row | {
        "measured_ds": dt.date.fromisoformat(yesterday), "impressions": measured.impressions, "hits": measured.hits,
        "hit_rate": measured.hit_rate, "wasted_share": measured.wasted_share,
        "model_age_days": float((dt.date.fromisoformat(ds) - previous["model_ds"]).days),
        "input_age_days": measured.input_age_days,
    }
