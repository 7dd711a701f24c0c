"""Write gold.mixture_manifest for one day: which example files training reads, at which rates.

    python -m jobs.mix --ds R [--config FILE]

Cost-free mixing: nothing is copied or rewritten. The manifest pins silver.training_examples and
silver.user_sequences at one Delta version each (the examples at the newest validated version of
its days, refused when a day was rewritten after its validation; the sequences at the latest) and lists, from the Delta log, the files of
each source with their row counts (schemas/mixture.py). Days, with W = attribution_window_days:
  eval:       the latest closed example day, E = R - W (held out, later than every other day);
  validation: the `mix.validation_days` days V just before E (hyper-parameters are chosen on
              them, so no choice sees E; none when validation_days is 0);
  train:      the `mix.train_days` days before those (from start_ds on).
Days come from the registry's `mixed_days` rule (gem.lakehouse.stages), the days the gate checks.
Nothing to train on yet (E - V - 1 < start_ds) exits 99, which the DAG shows as skipped.

Rates per training source s with n_s rows (`mix.policy`, see gem.config.MixConfig):
  proportional  p_s = max_rate
  temperature   p_s = max_rate * (n_s / n_min) ** (1/T - 1): realized share ~ n_s ** (1/T),
                the smallest source is drawn at max_rate and larger ones are down-sampled
  fixed         p_s = fixed_rates[s] (default max_rate)
plus `mix.negative_rate` on rows whose label for the task is 0. Validation and eval sources use
rate 1, no negative down-sampling (they are scored in full, weights 1). Gate: validate_examples
for every example day used. No Spark: the log is read and the manifest written through
`deltalake` (gem.lakehouse.commit.StageCommit.replace_arrow).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from gem.config import GemConfig, MixConfig
from gem.data.delta_log import LoggedFile, logged_files, read_logged
from gem.lakehouse import tables
from gem.lakehouse.commit import StageCommit, StageContext, StageResult
from gem.lakehouse.stages import mixed_days
from gem.pipeline.airflow.orchestration import NOTHING_READY_EXIT
from gem.pipeline.cli import StageCall, run_command, stage_command
from schemas.examples import LABEL_COLUMNS, SILVER_TRAINING_EXAMPLES
from schemas.mixture import GOLD_MIXTURE_MANIFEST, SPLITS
from schemas.sequences import SILVER_USER_SEQUENCES
from schemas.tasks import task_name

STAGE = "mix"
VALIDATE_STAGE = "validate_examples"
VALIDATE_SILVER_STAGE = "validate_silver"
# A manifest is a plan (one row per source file and split), not a transform of input rows.
NO_INPUT_COUNT = "a plan: one row per (split, source, file); nothing is read row by row"


@dataclass(frozen=True)
class MixDays:
    """The example days of one mixture, per split: train < validation < eval, disjoint."""

    train: tuple[str, ...]
    validation: tuple[str, ...]
    eval: str

    def by_split(self) -> dict[str, tuple[str, ...]]:
        """Split -> its days, in schemas.mixture.SPLITS order (a split with no days is left out)."""
        days = {"train": self.train, "validation": self.validation, "eval": (self.eval,)}
        return {split: days[split] for split in SPLITS if days[split]}

    @property
    def all_days(self) -> list[str]:
        """Every example day the mixture reads, oldest first."""
        return [d for days in self.by_split().values() for d in days]


# --------------------------------------------------------------------------------------------------
# Pure decisions.


def mix_days(cfg: GemConfig, ds: str) -> MixDays | None:
    """Held-out, validation and training days for the mix of run day ds; None if nothing to train
    on yet. The registry's `mixed_days` names them all (the gate checks those days); the newest is
    held out, the `mix.validation_days` before it validate, the rest train.

    Example: window 1, train_days 14, validation_days 1, start 2026-01-01, ds 2026-01-04 ->
    eval 2026-01-03, validation ("2026-01-02",), train ("2026-01-01",).
    """
    days = mixed_days(cfg, ds)
    if not days:
        return None
    validation_at = len(days) - 1 - cfg.mix.validation_days  # >= 1: mixed_days leaves a training day
    return MixDays(tuple(days[:validation_at]), tuple(days[validation_at:-1]), days[-1])


def sampling_rates(rows_by_source: Mapping[str, int], mix: MixConfig) -> dict[str, float]:
    """Training source -> probability a positive row is drawn per pass (mix.policy; module doc).

    Example (temperature 2, max_rate 1): {"a": 100, "b": 400} -> {"a": 1.0, "b": 0.5}: draws
    100 and 200, shares 1:2 = sqrt(100):sqrt(400).
    """
    if mix.policy == "fixed":
        return {s: float(mix.fixed_rates.get(s, mix.max_rate)) for s in rows_by_source}
    if mix.policy == "proportional":
        return {s: float(mix.max_rate) for s in rows_by_source}
    nonempty = [n for n in rows_by_source.values() if n > 0]
    if not nonempty:
        return {s: float(mix.max_rate) for s in rows_by_source}
    smallest, exponent = min(nonempty), 1.0 / mix.temperature - 1.0
    return {s: float(mix.max_rate * (max(n, smallest) / smallest) ** exponent) for s, n in rows_by_source.items()}


# --------------------------------------------------------------------------------------------------
# Files (listed from the Delta log by gem.data.delta_log).


def label_positives(files: list[LoggedFile], label_types: tuple[str, ...]) -> dict[tuple[str, str], int]:
    """(file path, label type) -> rows with that label 1; reads only the label columns."""

    out = {}
    for f in files:
        labels = read_logged([f], {}, [LABEL_COLUMNS[t] for t in label_types])
        for t in label_types:
            out[(f.path, t)] = int(pc.sum(labels[LABEL_COLUMNS[t]]).as_py() or 0)
    return out


def manifest_rows(cfg: GemConfig, ds: str, days: MixDays, examples_path: str, examples_version: int,
                  sequences_path: str, sequences_version: int) -> tuple[str, list[dict[str, Any]]]:
    """(mixture_id, gold.mixture_manifest rows) for the run day ds."""
    files = [f for f in logged_files(examples_path, examples_version) if f.partition["surface"] in cfg.surfaces]
    split_days = days.by_split()
    by_split = {split: [f for f in files if f.partition["ds"] in wanted] for split, wanted in split_days.items()}
    positives = label_positives([f for split_files in by_split.values() for f in split_files], cfg.label_types)

    sources: list[tuple[str, str, str, list[LoggedFile]]] = []  # (split, surface, label type, files)
    for split, split_files in by_split.items():
        for surface, label_type in cfg.tasks:
            sources.append((split, surface, label_type, [f for f in split_files if f.partition["surface"] == surface]))
    train_rows = {task_name(s, t): sum(f.rows for f in fs) for split, s, t, fs in sources if split == "train"}
    train_rates = sampling_rates(train_rows, cfg.mix)

    rows = []
    for split, surface, label_type, source_files in sources:
        name = task_name(surface, label_type)
        is_train = split == "train"  # validation and eval rows are all read, at weight 1
        first, last = split_days[split][0], split_days[split][-1]
        for f in sorted(source_files, key=lambda f: f.path):
            rows.append({
                "ds": dt.date.fromisoformat(ds), "split": split, "source": name, "surface": surface,
                "label_type": label_type, "first_ds": dt.date.fromisoformat(first),
                "last_ds": dt.date.fromisoformat(last), "table_path": examples_path,
                "table_version": examples_version, "file_path": f.path, "file_ds": dt.date.fromisoformat(f.partition["ds"]),
                "file_rows": f.rows, "file_bytes": f.bytes, "source_rows": sum(x.rows for x in source_files),
                "source_positives": sum(positives[(x.path, label_type)] for x in source_files),
                "sampling_rate": train_rates[name] if is_train else 1.0,
                "negative_rate": cfg.mix.negative_rate if is_train else 1.0,
                "policy": cfg.mix.policy,
                "temperature": cfg.mix.temperature if cfg.mix.policy == "temperature" else None,
                "seed": cfg.mix.seed, "sequences_path": sequences_path, "sequences_version": sequences_version,
            })
    digest = hashlib.sha256(json.dumps(rows, default=str, sort_keys=True).encode()).hexdigest()[:10]
    mixture_id = f"mix-{ds}-{digest}"
    for r in rows:
        r["mixture_id"] = mixture_id
    return mixture_id, rows


# --------------------------------------------------------------------------------------------------
# Thin I/O.


def run(ctx: StageContext, ds: str) -> StageResult:
    """The manifest of run day ds (no Spark: the log is read and the manifest written through
    `deltalake`); nothing published when no training day precedes the held-out day yet. Details:
    mixture_id, sources, examples_version."""

    t0, cfg = time.time(), ctx.cfg
    days = mix_days(cfg, ds)
    if days is None:
        return StageResult(STAGE, ds, time.time() - t0)
    commit = StageCommit.begin(ctx, STAGE, ds)
    examples_path = tables.table_path(cfg, SILVER_TRAINING_EXAMPLES)
    sequences_path = tables.table_path(cfg, SILVER_USER_SEQUENCES)
    examples_version = commit.validated_version(SILVER_TRAINING_EXAMPLES, VALIDATE_STAGE, days.all_days)
    # The loader reads the sequences of the mixed days: at the version their validation saw.
    sequences_version = commit.validated_version(SILVER_USER_SEQUENCES, VALIDATE_SILVER_STAGE, days.all_days)
    mixture_id, rows = manifest_rows(cfg, ds, days, examples_path, examples_version, sequences_path, sequences_version)
    commit.replace_arrow(pa.Table.from_pylist(rows, schema=GOLD_MIXTURE_MANIFEST.arrow_schema()), GOLD_MIXTURE_MANIFEST)
    commit.publish(None, written_tables=(GOLD_MIXTURE_MANIFEST,), no_input_count=NO_INPUT_COUNT)
    n_sources = len({(r["split"], r["source"]) for r in rows})
    return commit.result(t0, mixture_id=mixture_id, sources=n_sources, examples_version=examples_version)


def command_line(call: StageCall) -> int:
    """Write the mixture manifest of run day --ds; print its id and sources, or exit 99 while no
    training day precedes the validation and held-out days."""
    result = run(StageContext(call.cfg), call.ds)
    if not result.published:
        print(f"{STAGE} ds={call.ds}: no closed example day before the validation and held-out days yet; "
              "nothing to do")
        return NOTHING_READY_EXIT
    details = result.details
    print(f"{result.summary()} ({details['mixture_id']}: {details['sources']} sources, "
          f"examples version {details['examples_version']})")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(stage_command("mix", command_line), argv)


if __name__ == "__main__":
    sys.exit(main())
