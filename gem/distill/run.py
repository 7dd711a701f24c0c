"""One distillation day, the `distill` stage's entry point (jobs.distill is its command line).

On run day R the precompute stage has logged the FM's predictions and history codes for the held-out
example day H = R - attribution_window_days, and earlier runs did the same for their held-out days.
The training days are those of the student_train.days before H that the FM predicted (serving's
logs of them), H' = H - 1 among them. For each surface, the stage:

    trains     the surface's student (student.variant) on every example of the surface on the
               training days, student_train.steps steps or student_train.passes passes, warm-started
               from the student promoted before R; with student_train.baseline, also the no-FM
               baseline student on the same days and steps, from its own promoted one;
    scores     it on H (serving head: its own features, and with LoopFM codes logged before each
               example), the FM's logged predictions of the same examples, and the student
               promoted before R;
    promotes   the student for R when the promotion gate passes it (gem.train.gate, as the
               foundation model's pretraining: against the promoted student); otherwise the
               promoted student stays, and the decision says why;
    ships      a promoted student as a serving artifact (gem.serve.export): an ONNX graph, its
               feature spec and lineage under <checkpoints>/serving/<student>/<R>/, held to the
               eager student on held-out rows; its export seconds print and are in the result.

gold.metrics gets one row per (R, surface, variant, task): arch "student:<variant>" (and
"student:baseline" for the baseline beside it), and the FM's logged predictions as arch "fm_logged" (the teacher's NE on the same examples, for the transfer ratio).

No leakage (gem.distill.leakage): every FM output read - predictions of the training days and H, codes of the days
within student.history_codes.max_age_days before H - was computed by a model trained before its day;
the run fails otherwise. The stage skips (nothing published; the job exits 99) until precompute has
run on R and on R - 1: before that no FM-predicted day precedes the held-out one.
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gem import storage
from gem.data.delta_log import logged_files
from gem.data.encode import DENSE_COLUMNS
from gem.data.loader import SPARSE_FEATURES, ResumableLoader
from gem.days import day_range, shift_day
from gem.distill import leakage
from gem.distill.data import StudentStream, surface_manifest
from gem.distill.signals import FmSignals, LoggedOutputs
from gem.lakehouse import completions, tables
from gem.lakehouse.commit import StageCommit, StageContext, StageResult
from gem.model.heads import shrunk_base_rates
from gem.model.student import StudentTask, build_student
from gem.precompute.plan import examples_day
from gem.serve import export as serving
from gem.train import checkpoint as checkpoints
from gem.train import gate, promotion
from gem.train.daily import checkpoint_root, metrics_rows, write_metrics
from gem.train.evaluate import metrics_table, per_task, score
from gem.train.trainer import Trainer
from schemas.examples import SILVER_TRAINING_EXAMPLES
from schemas.precompute import GOLD_FM_HISTORY_CODES, GOLD_FM_PREDICTIONS, GOLD_PRECOMPUTE_STATS
from schemas.sequences import SILVER_USER_SEQUENCES

if TYPE_CHECKING:
    from gem.config import GemConfig

STAGE = "distill"
FM_ARCH = "fm_logged"  # gold.metrics' arch for the FM's logged predictions
NO_INPUT_COUNT = "scores: one gold.metrics row per (surface, task) for the student and for the FM's logged predictions"


def student_arch(variant: str) -> str:
    return f"student:{variant}"


def promotion_name(variant: str, surface: str) -> str:
    """The student's name among promoted models (one per variant and surface)."""
    return f"student-{variant}-{surface}"


@dataclass(frozen=True)
class DistillInputs:
    """What a distillation day reads: days, table versions and the FM's signals per surface."""

    train_days: tuple[str, ...]  # oldest first; the newest is the day before eval_day
    eval_day: str
    examples: tuple[str, int]  # (path, version) of silver.training_examples
    sequences: tuple[str, int]  # (path, version) of silver.user_sequences
    predictions_version: int
    codes_version: int
    code_days: tuple[str, ...]
    fm_models: dict[str, leakage.FmModel]
    counters_start_ds: str  # the pipeline's start_ds (Manifest.counters_start_ds)

    # The logged outputs, read on first use and shared by every surface's and arm's signals.
    _logged: dict[tuple[str, ...], LoggedOutputs] = field(default_factory=dict, compare=False, repr=False)

    def signals(self, cfg: GemConfig, tasks: tuple[str, ...], days: list[str]) -> FmSignals:
        key = tuple(days)
        if key not in self._logged:
            self._logged[key] = LoggedOutputs.read(cfg, days, list(self.code_days), self.predictions_version,
                                                   self.codes_version, cfg.model.history_codes.code_dim // 2)
        return self._logged[key].for_tasks(tasks, cfg.student.history_codes.max_codes)

    @property
    def train_day(self) -> str:
        """The newest training day (the day before the held-out one)."""
        return self.train_days[-1]

    def manifest(self, surface: str, tasks: tuple[str, ...], days: str | Sequence[str], split: str,
                 seed: int) -> Any:
        """The surface's examples of `days` (one day or several)."""
        return surface_manifest(*self.examples, *self.sequences, surface, tasks,
                                [days] if isinstance(days, str) else list(days), split, seed, self.counters_start_ds)

    def surfaces(self, cfg: GemConfig) -> list[str]:
        """The configured surfaces with examples on the held-out day and on a training day."""
        present: dict[str, set[str]] = {}
        for f in logged_files(*self.examples):
            present.setdefault(f.partition.get("ds", ""), set()).add(f.partition.get("surface", ""))
        trained = set().union(*(present.get(d, set()) for d in self.train_days))
        return [s for s in cfg.surfaces if s in trained & present.get(self.eval_day, set())]


@dataclass
class StudentRun:
    """One trained and scored student."""

    surface: str
    variant: str
    scores: dict[str, dict[str, Any]]  # task -> evaluate()'s figures on the eval day
    fm_scores: dict[str, dict[str, Any]]  # the FM's logged predictions on the same examples
    steps: int
    examples: int
    seconds: float
    checkpoint: checkpoints.Location | None
    # Its predictions of the held-out pairs beside those of the student it was given as `incumbent`.
    paired: gate.Paired | None = None
    task: StudentTask | None = None  # the trained student (gem.serve.export ships it when promoted)
    train_rows: int = 0  # the surface's examples on the training days (`examples` counts those trained on, repeats too)


def surface_tasks(cfg: GemConfig, surface: str) -> tuple[str, ...]:
    return tuple(f"{s}/{t}" for s, t in cfg.tasks if s == surface)


def train_student(cfg: GemConfig, inputs: DistillInputs, surface: str, variant: str, run_dir: str | Path,
                  warm_start: str | Path | None = None, seed: int | None = None, steps: int | None = None,
                  incumbent: promotion.Promotion | None = None) -> StudentRun:
    """Train `variant`'s student of `surface` on inputs.train_days, score it and the FM on inputs.eval_day;
    `incumbent`: the promoted student, scored on the same examples for the promotion gate."""
    t0 = time.time()
    train_cfg = cfg.student_train if seed is None else dataclasses.replace(cfg.student_train, seed=seed)
    student_cfg = dataclasses.replace(cfg.student, variant=variant)
    tasks = surface_tasks(cfg, surface)
    loader_cfg = cfg.loader.capped(student_cfg.dlrm.max_len)
    torch.manual_seed(train_cfg.seed)
    train_manifest = inputs.manifest(surface, tasks, inputs.train_days, "train", train_cfg.seed)
    eval_manifest = inputs.manifest(surface, tasks, inputs.eval_day, "eval", train_cfg.seed)
    task = build_student(student_cfg, tasks, SPARSE_FEATURES, len(DENSE_COLUMNS), cfg.model.history_codes.code_dim,
                         train_cfg.task_weights)
    task.init_from_base_rates(shrunk_base_rates({s.name: (s.positives, s.rows) for s in train_manifest.sources}))
    signals = inputs.signals(cfg, tasks, [*inputs.train_days, inputs.eval_day])
    # The configured steps (or passes) run whole: the loader repeats passes over the days, and a
    # learning-rate schedule spans the steps that actually run.
    rows = sum(train_manifest.file_rows.values())
    by_passes = math.ceil(train_cfg.passes * rows / cfg.loader.batch_size) if train_cfg.passes else None
    train_cfg = dataclasses.replace(train_cfg, steps=steps or by_passes or train_cfg.steps)
    stream = ResumableLoader(StudentStream(train_manifest, tasks, loader_cfg, signals))
    trainer = Trainer(task, stream, train_cfg, run_dir, config_snapshot=cfg.to_dict())
    if not trainer.resume() and warm_start is not None:
        trainer.warm_start(warm_start)
    result = trainer.fit()
    trainer.close()
    eval_stream = ResumableLoader(StudentStream(eval_manifest, tasks, loader_cfg, signals, rank=0, world_size=1))
    batches = list(eval_stream.epoch())
    plain = dataclasses.replace(student_cfg, embeddings=dataclasses.replace(student_cfg.embeddings, backend="torch"))
    theirs = gate.incumbent_task(incumbent, lambda heads: build_student(
        plain, heads, SPARSE_FEATURES, len(DENSE_COLUMNS), cfg.model.history_codes.code_dim),
        student_cfg.embeddings.backend)
    paired = gate.score_pair(batches, task, theirs)
    scores = per_task(paired.candidate)
    fm_scores = score([dataclasses.replace(b, label_mask=b.label_mask & b.fm_prediction_mask) for b in batches],
                      lambda b: b.fm_predictions)
    return StudentRun(surface, variant, scores, fm_scores, result.steps, result.examples, time.time() - t0,
                      result.checkpoint, paired, task, rows)


def train_and_gate(cfg: GemConfig, inputs: DistillInputs, surface: str, variant: str, root: Path, ds: str,
                   steps: int | None) -> tuple[StudentRun, promotion.Promotion | None, promotion.Decision]:
    """`variant`'s student of `surface` for run day ds, warm-started from its promoted one and
    judged by the promotion gate against it -> (the run, the promoted one it started from, the decision)."""
    name = promotion_name(variant, surface)
    previous = promotion.warm_start_for(root, name, ds)
    run_dir = storage.join(root, "students", f"{name}-{ds}")  # a local folder or an object store prefix
    trained = train_student(cfg, inputs, surface, variant, run_dir, previous.checkpoint if previous else None,
                            steps=steps, incumbent=previous)
    checkpoint = trained.checkpoint or checkpoints.latest(run_dir)
    candidate = promotion.Promotion(name, ds, checkpoint, trained.steps, surface_tasks(cfg, surface),
                                    promotion.newest_day([inputs.train_day,
                                                          previous.trained_through if previous else None]))
    assert trained.paired is not None  # train_student scores every student it trains
    return trained, previous, gate.decide(root, candidate, trained.paired, cfg.promotion, by=STAGE)


def training_days(newest: str, days: int, predicted: Collection[str]) -> tuple[str, ...]:
    """The example days a student trains on, oldest first: those of the `days` ending at `newest`
    (the day before the held-out one) that the FM predicted (`predicted`: serving logged them), and
    `newest` always (leakage.check refuses it when no precompute record names its model)."""
    return tuple(d for d in day_range(shift_day(newest, 1 - days), newest) if d in predicted or d == newest)


def plan_inputs(commit: StageCommit) -> DistillInputs:
    """The days, versions and FM models of commit's day; LeakageError when an FM output breaks the rule."""
    cfg, ds = commit.cfg, commit.ds
    eval_day, newest = examples_day(cfg, ds), examples_day(cfg, shift_day(ds, -1))
    assert eval_day is not None and newest is not None  # run() checked
    today = commit.record("precompute", ds)
    commit.also_needs("precompute", shift_day(ds, -1))
    versions = today["table_versions"]
    models = leakage.fm_models_by_day(cfg, int(versions[GOLD_PRECOMPUTE_STATS.name]))
    train_days = training_days(newest, cfg.student_train.days, models)
    for day in train_days:
        for validation in ("validate_examples", "validate_silver"):
            commit.also_needs(validation, day)
    examples = commit.validated_version(SILVER_TRAINING_EXAMPLES, "validate_examples", [*train_days, eval_day])
    sequences = commit.validated_version(SILVER_USER_SEQUENCES, "validate_silver", [*train_days, eval_day])
    oldest = shift_day(eval_day, -int(cfg.student.history_codes.max_age_days) - 1)
    code_days = tuple(d for d in day_range(oldest, eval_day) if d in models)
    checked = leakage.check(models, sorted({*train_days, eval_day, *code_days}))
    return DistillInputs(
        train_days=train_days, eval_day=eval_day,
        examples=(tables.table_path(cfg, SILVER_TRAINING_EXAMPLES), examples),
        sequences=(tables.table_path(cfg, SILVER_USER_SEQUENCES), sequences),
        predictions_version=int(versions[GOLD_FM_PREDICTIONS.name]),
        codes_version=int(versions[GOLD_FM_HISTORY_CODES.name]), code_days=code_days, fm_models=checked,
        counters_start_ds=cfg.start_ds)


def ready(cfg: GemConfig, ds: str) -> str | None:
    """Why run day ds has nothing to distill yet (None: it has)."""
    if completions.completion(cfg, "precompute", ds) is None:
        return f"precompute has no record of {ds} (it skipped: no model yet)"
    previous = shift_day(ds, -1)
    if examples_day(cfg, previous) is None or completions.completion(cfg, "precompute", previous) is None:
        return f"no FM-predicted day to train on before the held-out day (precompute did not run on {previous})"
    return None


def run(ctx: StageContext, ds: str, steps: int | None = None) -> StageResult:
    """Distill run day ds (module docstring); nothing published when ds is not ready."""
    t0, cfg = time.time(), ctx.cfg
    if (why := ready(cfg, ds)) is not None:
        print(f"distill ds={ds}: nothing to distill yet: {why}")
        return StageResult(STAGE, ds, 0.0)
    commit = StageCommit.begin(ctx, STAGE, ds)
    inputs = plan_inputs(commit)
    root, variant = checkpoint_root(cfg), cfg.student.variant
    run_id = f"{STAGE}:{ds}:{uuid.uuid4().hex[:8]}"
    student_rows, fm_rows, details = [], [], {}
    surfaces = inputs.surfaces(cfg)
    if not surfaces:
        raise ValueError(f"distill ds={ds}: no surface has examples on both {inputs.train_day} and {inputs.eval_day}")
    days = f"{inputs.train_days[0]}..{inputs.train_day}"
    for surface in surfaces:
        name = promotion_name(variant, surface)
        trained, previous, decision = train_and_gate(cfg, inputs, surface, variant, root, ds, steps)
        print(f"student {surface} ({variant}): {trained.steps} steps on {days} ({len(inputs.train_days)} days), "
              f"{trained.examples:,} examples, {trained.seconds:.1f}s; held-out {inputs.eval_day}:")
        print(metrics_table(trained.scores, min_positives=cfg.report.min_positives))
        print(f"  the FM's logged predictions on the same examples ({inputs.fm_models[inputs.eval_day].version}):")
        print(metrics_table(trained.fm_scores, min_positives=cfg.report.min_positives))
        mixture_id = f"student:{surface}:{days}"
        student_rows += metrics_rows(cfg, ds, run_id, student_arch(variant), trained.scores, trained.steps,
                                     mixture_id, inputs.examples[1], inputs.sequences[1])
        fm_rows += metrics_rows(cfg, ds, run_id, FM_ARCH, trained.fm_scores, 0, mixture_id, inputs.examples[1],
                                inputs.sequences[1])
        print(f"  {decision.summary()}")
        details[surface] = {"steps": trained.steps, "examples": trained.examples, "train_rows": trained.train_rows,
                            "ne": {t: s["ne"] for t, s in trained.scores.items()},
                            "fm_ne": {t: s["ne"] for t, s in trained.fm_scores.items()},
                            "promoted": decision.promoted}
        if cfg.student_train.baseline and variant != "baseline":  # what the FM's signals add
            control, _, control_decision = train_and_gate(cfg, inputs, surface, "baseline", root, ds, steps)
            print(f"  the no-FM baseline student on the same days and steps ({control.seconds:.1f}s):")
            print(metrics_table(control.scores, min_positives=cfg.report.min_positives))
            print(f"  {control_decision.summary()}")
            student_rows += metrics_rows(cfg, ds, run_id, student_arch("baseline"), control.scores, control.steps,
                                         mixture_id, inputs.examples[1], inputs.sequences[1])
            details[surface]["baseline_ne"] = {t: s["ne"] for t, s in control.scores.items()}
        if decision.promoted and cfg.student_train.export:  # ships as a serving artifact (gem.serve.export)
            exported = serving.export_student(cfg, inputs, surface, trained, name, ds, root, previous)
            print(f"  serving artifact: {exported.path} (ONNX opset {exported.opset}, exported in "
                  f"{exported.seconds:.1f}s; {exported.parity_rows} held-out rows, max |artifact - eager| "
                  f"{exported.max_abs_diff:.2g})")
            details[surface]["serving"] = {"artifact": exported.path, "export_s": round(exported.seconds, 2),
                                           "parity_max_abs_diff": exported.max_abs_diff}
    written = len(student_rows) + len(fm_rows)
    for arch in dict.fromkeys(r["arch"] for r in student_rows):  # the student's rows, then its baseline's
        write_metrics(commit, [r for r in student_rows if r["arch"] == arch])
    write_metrics(commit, fm_rows)
    commit.publish(None, written, no_input_count=NO_INPUT_COUNT)
    return commit.result(t0, train_day=inputs.train_day, train_days=list(inputs.train_days), eval_day=inputs.eval_day,
                         fm_trained_through={d: m.trained_through for d, m in inputs.fm_models.items()},
                         surfaces=details)

