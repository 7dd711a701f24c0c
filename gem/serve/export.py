"""A trained student -> a self-contained serving artifact folder (gem.serve.score serves it).

    model.onnx         the serving head as one ONNX graph (torch.export, then torch.onnx.export's
                       dynamo exporter), dynamic in the batch, each history's length and the codes' count
    feature_spec.json  the columns a request carries, their dtypes, hash spaces and buckets, history
                       lengths, and what happens to unknown ids (gem.serve.features)
    artifact.json      the runtime it needs (onnxruntime version, ONNX opset), its lineage (the FM
                       versions it learned from, training days, input table versions), the export's
                       seconds and the parity check's figures
    holdout.parquet    the held-out feature rows the parity check scored, with the eager student's
                       logits (`eager_logit_<label type>`): a request sample to try the artifact on

Why ONNX: the scorer then needs onnxruntime, numpy and pyarrow only (no torch, no compiler), and an
export compiles nothing; an AOTInductor package would need a C++ compiler at every export and torch
in every serving process (docs/models.md, "Serving a student").

The graph. torch.export cannot trace the student's jagged paths (sizes that come from the data), so
ServingStudent runs the student's own modules on padded inputs with masks where the eager student
gathers: the mean of the newest max_len history embeddings per event type, and (pooled_codes)
LoopFM's codes kept strictly before the request, within max_age_days, the newest max_codes. Before
an artifact is written, held-out rows are scored through gem.serve.score and the eager student
(tests/unit/test_serve.py holds every variant to the same bound); a difference above
PARITY_ABS + PARITY_REL x |eager logit| fails the export (`parity_holds`).
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnxruntime
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from torch import nn

from gem import storage
from gem.data.batch import Batch, Jagged
from gem.data.encode import DENSE_COLUMNS, VOCABULARIES, hash_ids, timestamps_us
from gem.data.loader import EXAMPLE_COLUMNS, SPARSE_FEATURES, ResumableLoader, example_batch
from gem.distill.data import StudentStream
from gem.model.configs import StudentConfig
from gem.model.dlrm import dot_interaction
from gem.model.history_code_feature import HistoryCodeFeature
from gem.model.ops.int4 import dequantize_int4, unpack_int4
from gem.model.ops.softmax_attention import softmax_attention
from gem.model.ops.time_encoding import time_gap_buckets
from gem.model.student import HISTORY_ATTENTION, HISTORY_MEAN, TARGET_FEATURE, StudentTask
from gem.serve.features import (
    CODE_TIMES_COLUMN,
    CODES_COLUMN,
    DAY_COLUMN,
    TIME_COLUMN,
    feature_spec,
    history_column,
    history_inputs,
)
from gem.serve.score import ARTIFACT_FILE, HOLDOUT_FILE, MODEL_FILE, SPEC_FILE, Artifact, logit_column
from gem.train import promotion
from schemas.examples import LABEL_COLUMNS
from schemas.ids import HASHED_IDS, hash_column

if TYPE_CHECKING:
    from gem.config import GemConfig
    from gem.distill.run import DistillInputs, StudentRun

# The artifact's logits may differ from the eager student's by PARITY_ABS + PARITY_REL * |eager logit|:
# float32's rounding grows with a logit's size (an undertrained student's logits reach tens), and two
# runtimes sum in different orders.
PARITY_ABS = 1e-5
PARITY_REL = 1e-5
HOLDOUT_ROWS = 256  # held-out rows the export's parity check scores (whole loader batches, at most this many)
FORMAT = "onnx"


def parity_holds(scored: np.ndarray, eager: np.ndarray) -> bool:
    """Whether every artifact logit is within PARITY_ABS + PARITY_REL x |eager logit| of the eager one
    (NaN never is)."""
    return bool(np.all(np.abs(scored - eager) <= PARITY_ABS + PARITY_REL * np.abs(eager)))


class ExportError(RuntimeError):
    """A student that cannot be exported, or whose artifact scores other than the eager student."""


def history_jagged(ids: torch.Tensor, offsets: torch.Tensor) -> Jagged:
    """One event type's history as a Batch holds it; the fields besides ad_id (surface, objective,
    gap_s) are zeros: a student's DLRM body reads only the ids."""
    unused = torch.zeros_like(ids)
    return Jagged({"ad_id": ids, "surface": unused, "objective": unused, "gap_s": unused.to(torch.float32)}, offsets)


class ServingStudent(nn.Module):
    """The serving head of a student as a function of padded tensors (feature_spec's "inputs"):

    sparse_ids (B, F) int64, dense (B, D) float32, per event type <event>_ids (B, L) int64 (oldest
    first) and <event>_lengths (B,) int64; LoopFM students also impression_time (B,) int64
    microseconds, fm_codes (B, C, K/2) uint8, fm_code_times (B, C) int64 and fm_code_lengths (B,)
    -> (logits (B, T), probabilities (B, T)).

    The student's own modules (embeddings, DLRM dense arch, interaction and over arch, heads, the
    LoopFM layers) on padded inputs: what the eager student computes on jagged ones (mean of the
    newest max_len history embeddings, DLRM.forward, StudentTask.representation), with masks instead
    of data-dependent gathers.
    """

    def __init__(self, task: StudentTask, sparse_features: tuple[str, ...]) -> None:
        super().__init__()
        if getattr(task.embeddings, "backend", None) != "torch":
            raise ExportError("a student exports with plain-torch embeddings (student.embeddings.backend: torch)")
        self.task, self.sparse_features = task, tuple(sparse_features)
        self.max_len = dict(task.body.cfg.max_len)  # event type -> newest events read, in the body's order
        # byte -> its two INT4 codes dequantized (256, 2): the graph unpacks codes with one gather
        levels = dequantize_int4(unpack_int4(torch.arange(256, dtype=torch.uint8)[:, None]), torch.float32)
        self.register_buffer("code_levels", levels, persistent=False)

    def input_names(self) -> list[str]:
        names = ["sparse_ids", "dense", *(n for e in self.max_len for n in history_inputs(e))]
        if self.task.history_codes is not None:
            names += [TIME_COLUMN, CODES_COLUMN, CODE_TIMES_COLUMN, "fm_code_lengths"]
        return names

    def forward(self, sparse_ids: torch.Tensor, dense: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        task, body, embeddings = self.task, self.task.body, self.task.embeddings
        sparse = {f: embeddings.lookup(f, sparse_ids[:, j]) for j, f in enumerate(self.sparse_features)}
        bags = []
        for k, (event, max_len) in enumerate(self.max_len.items()):
            ids, lengths = rest[2 * k], rest[2 * k + 1]
            position = torch.arange(ids.shape[1])[None, :]
            kept = (position < lengths[:, None]) & (position >= lengths[:, None] - max_len)  # (B, L) the newest max_len
            vectors = embeddings.lookup(embeddings.cfg.sequence_table, ids) * kept[..., None].to(dense.dtype)
            bags.append(vectors.sum(1) / kept.sum(1).clamp(min=1)[:, None].to(dense.dtype))
        if task.history_codes is not None:
            impression_time, codes, code_times, code_lengths = rest[2 * len(self.max_len):]
            mean, attended = pooled_codes(task.history_codes, self.code_levels, codes, code_times, code_lengths,
                                          impression_time, sparse[TARGET_FEATURE])
            sparse = {**sparse, HISTORY_MEAN: mean, HISTORY_ATTENTION: attended}
        embedded = torch.stack([*(sparse[f] for f in body.sparse_features), *bags], dim=1)  # (B, F, d)
        logits = task.heads(body.over_arch(dot_interaction(body.dense_arch(dense), embedded)))
        return logits, torch.sigmoid(logits)


def pooled_codes(feature: HistoryCodeFeature, levels: torch.Tensor, codes: torch.Tensor, code_times: torch.Tensor,
                 lengths: torch.Tensor, example_time_us: torch.Tensor, target: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """HistoryCodeFeature's (mean (B, d), attention (B, d)) over padded codes: codes (B, C, K/2) uint8,
    code_times (B, C) int64 (oldest first within each length), lengths (B,), example times (B,);
    levels (256, 2): each byte's two codes dequantized (unpack_int4, dequantize_int4).

    kept = real (position < length) and 0 < example time - code time <= max_age and among the
    max_codes newest of those: the set past_code_positions keeps, as a (B, C) mask."""
    c = code_times.shape[1]
    age = example_time_us[:, None] - code_times  # (B, C) microseconds before the example
    real = torch.arange(c)[None, :] < lengths[:, None]
    eligible = real & (age > 0) & (age <= feature.max_age_us)
    newer = eligible.to(torch.int64).flip(1).cumsum(1).flip(1)  # (B, C) eligible codes at or after each position
    kept = eligible & (newer <= feature.cfg.max_codes)
    values = F.embedding(codes.to(torch.int64), levels.to(feature.code.weight.dtype)).flatten(-2)  # (B, C, K)
    gap_s = age.to(torch.float64) / 1e6
    tokens = (feature.code(values) + feature.time(time_gap_buckets(gap_s, feature.cfg.time_buckets)))
    tokens = tokens * kept[..., None].to(tokens.dtype)  # (B, C, d), 0 where not kept
    count = kept.sum(1).clamp(min=1)[:, None].to(tokens.dtype)
    mean = tokens.sum(1) / count
    q = feature.query(target)[:, None, None, :]  # (B, 1, 1, d)
    k, v = feature.key(tokens)[:, None], feature.value(tokens)[:, None]  # (B, 1, C, d)
    attended = softmax_attention(q, k, v, feature.dim ** -0.5, kept[:, None, None, :])[:, 0, 0]
    return mean, attended


def example_inputs(graph: ServingStudent, code_bytes: int, b: int = 3, length: int = 2) -> tuple[torch.Tensor, ...]:
    """Inputs to trace with: every dynamic size at least 2 (torch.export fixes a size of 0 or 1)."""
    g = torch.Generator().manual_seed(0)
    args: list[torch.Tensor] = [torch.randint(0, 1 << 40, (b, len(graph.sparse_features)), generator=g),
                                torch.randn(b, len(DENSE_COLUMNS), generator=g)]
    for _ in graph.max_len:
        args += [torch.randint(0, 1 << 40, (b, length), generator=g), torch.full((b,), length)]
    if graph.task.history_codes is not None:
        now = 20_454 * 86_400 * 1_000_000
        hours_before = torch.arange(length, 0, -1) * 3_600_000_000
        args += [torch.full((b,), now), torch.randint(0, 256, (b, length, code_bytes), dtype=torch.uint8, generator=g),
                 (now - hours_before).expand(b, length).clone(), torch.full((b,), length)]
    return tuple(args)


def dynamic_shapes(graph: ServingStudent) -> tuple[Any, ...]:
    """torch.export's dynamic sizes, in forward's argument form (sparse_ids, dense, *rest): the batch,
    each history's length and the codes' count."""
    batch = torch.export.Dim("batch", min=1)
    shapes: list[dict[int, Any]] = [{0: batch}, {0: batch}]
    for event in graph.max_len:
        shapes += [{0: batch, 1: torch.export.Dim(f"{event}_length", min=1)}, {0: batch}]
    if graph.task.history_codes is not None:
        codes = torch.export.Dim("codes", min=1)
        shapes += [{0: batch}, {0: batch, 1: codes}, {0: batch, 1: codes}, {0: batch}]
    return (shapes[0], shapes[1], tuple(shapes[2:]))


def export_onnx(graph: ServingStudent, path: Path, code_bytes: int) -> float:
    """Write the graph to `path` as one ONNX file (weights inside); returns the export's seconds.
    onnxscript's graph optimizer is left off: onnxruntime optimizes the graph when it loads it, and
    the optimizer would double the export's time."""
    started = time.perf_counter()
    graph.eval()
    onnx_log = logging.getLogger("torch.onnx")
    level = onnx_log.level
    onnx_log.setLevel(logging.ERROR)  # its notices about optional torchvision ops, one per process
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.export's deprecation notices
            program = torch.export.export(graph, example_inputs(graph, code_bytes), dynamic_shapes=dynamic_shapes(graph),
                                          strict=False)
            torch.onnx.export(program, f=str(path), dynamo=True, input_names=graph.input_names(),
                              output_names=["logits", "probabilities"], optimize=False, external_data=False,
                              verbose=False)
    finally:
        onnx_log.setLevel(level)
    return time.perf_counter() - started


def student_spec(cfg: StudentConfig, tasks: tuple[str, ...], sparse_features: tuple[str, ...], code_dim: int,
                 counters_start_ds: str) -> dict[str, Any]:
    """feature_spec of a student built from cfg (gem.model.student.build_student)."""
    buckets = cfg.embeddings.buckets
    sparse: dict[str, dict[str, Any]] = {}
    for name in sparse_features:
        if name in HASHED_IDS:
            sparse[name] = {"kind": "hashed_id", "buckets": buckets[name]}
        elif name in VOCABULARIES:
            sparse[name] = {"kind": "vocabulary", "vocabulary": list(VOCABULARIES[name]), "buckets": buckets[name]}
        else:
            sparse[name] = {"kind": "position", "buckets": buckets[name]}
    table = cfg.embeddings.sequence_table
    history = {e: {"max_len": n, "table": table, "buckets": buckets[table]} for e, n in cfg.dlrm.max_len.items()}
    codes = ({"code_bytes": code_dim // 2, "max_codes": cfg.history_codes.max_codes,
              "max_age_days": cfg.history_codes.max_age_days} if cfg.uses("history_codes") else None)
    surface = tasks[0].split("/")[0]
    return feature_spec(surface, tasks, sparse, history, counters_start_ds, codes)


def feature_rows(table: pa.Table, batch: Batch) -> pa.Table:
    """One loader batch's example rows (`table`, in the batch's order) as feature rows: the examples'
    own columns, and the batch's histories (hashed ad ids) and FM codes as list columns."""

    def lists(values: np.ndarray, offsets: torch.Tensor, kind: pa.DataType) -> pa.Array:
        return pa.ListArray.from_arrays(pa.array(offsets.numpy().astype(np.int32)), pa.array(values, kind))

    columns = {name: table[name] for name in [*EXAMPLE_COLUMNS, *HASHED_IDS, "surface"] if name in table.column_names}
    for name in HASHED_IDS:  # the loader reads ids hashed; a request may carry them so (feature_spec)
        if name not in columns and hash_column(name) in table.column_names:
            columns[name] = table[hash_column(name)]
    for event, jagged in batch.sequences.items():
        columns[history_column(event)] = lists(jagged.values["ad_id"].numpy(), jagged.offsets, pa.int64())
    codes = batch.fm_history_codes
    if codes is not None:
        packed = codes.values["codes"].numpy()
        columns[CODES_COLUMN] = lists(np.array([row.tobytes() for row in packed], dtype=object), codes.offsets,
                                      pa.binary())
        columns[CODE_TIMES_COLUMN] = lists(codes.values["time_us"].numpy(), codes.offsets, pa.timestamp("us", "UTC"))
    return pa.table(columns)


def rows_batch(rows: pa.Table, tasks: tuple[str, ...], counters_start_ds: str) -> Batch:
    """The Batch the training loader makes of feature rows (gem.data.loader.example_batch: the same
    encoding of ids, vocabularies, positions and counters), with their histories and FM codes as
    Jagged fields; rows need the example table's label columns. The eager side of parity checks."""
    n = rows.num_rows

    def jagged(column: str) -> tuple[pa.Array, torch.Tensor]:
        lists = rows[column].combine_chunks()
        offsets = lists.offsets.to_numpy().astype(np.int64)
        return lists.flatten(), torch.from_numpy(offsets - offsets[0])

    sequences = {}
    for name in rows.column_names:
        if name.startswith("history_"):
            values, offsets = jagged(name)
            ids = hash_ids(values) if pa.types.is_string(values.type) else values.to_numpy().astype(np.int64)
            sequences[name.removeprefix("history_")] = history_jagged(torch.from_numpy(ids), offsets)
    batch = example_batch(rows, tasks, np.ones((n, len(tasks)), bool), np.ones((n, len(tasks)), np.float32), {},
                          sequences, counters_start_ds)
    if CODES_COLUMN not in rows.column_names:
        return batch
    codes, offsets = jagged(CODES_COLUMN)
    times, _ = jagged(CODE_TIMES_COLUMN)
    packed = np.frombuffer(b"".join(codes.to_pylist()), np.uint8).reshape(len(codes), -1)
    return dataclasses.replace(batch, fm_history_codes=Jagged(
        {"codes": torch.from_numpy(packed.copy()), "time_us": torch.from_numpy(timestamps_us(times).copy())}, offsets))


def synthetic_rows(spec: dict[str, Any], n: int, seed: int = 0, day: str = "2026-01-20") -> pa.Table:
    """n random feature rows of `spec` with labels: ids of small pools (some never seen, some null),
    histories longer than the graph reads, codes older than max_age, at and after the request among
    them; for tests and bench.student_latency."""
    rng = np.random.default_rng(seed)
    start = np.datetime64(day, "us").astype(np.int64)
    times = start + rng.integers(0, 86_400_000_000, n)
    columns: dict[str, Any] = {"impression_id": [f"i{seed}-{k}" for k in range(n)],
                               "impression_time": pa.array(times, pa.timestamp("us", "UTC"))}
    for c in spec["columns"]:
        name, kind = c["name"], c["kind"]
        if kind == "hashed_id":
            columns[name] = pa.array([None if r < 0.02 else f"{name[0]}{int(r * 1000)}" for r in rng.random(n)],
                                     pa.string())
        elif kind == "vocabulary":
            pool = [spec["surface"]] if name == "surface" else [*c["vocabulary"], "unheard_of", None]
            columns[name] = pa.array([pool[k] for k in rng.integers(0, len(pool), n)], pa.string())
        elif kind == "position":
            columns[name] = pa.array(rng.integers(0, 80, n), pa.int64(), mask=rng.random(n) < 0.05)
        elif kind == "counter":
            columns[name] = pa.array(rng.exponential(3.0, n), pa.float64(), mask=rng.random(n) < 0.05)
        elif kind == "day":
            columns[name] = pa.array(np.full(n, np.datetime64(day, "D")), pa.date32())
        elif kind == "history":
            lengths = rng.integers(0, c["max_len"] + 4, n)
            columns[name] = pa.array([[f"a{k}" for k in rng.integers(0, 5000, m)] for m in lengths],
                                     pa.list_(pa.string()))
        elif kind == "codes":
            lengths = rng.integers(0, c["max_codes"] + 4, n)
            age_us = int((c["max_age_days"] + 5) * 86_400_000_000)
            columns[name] = pa.array([[rng.integers(0, 256, c["code_bytes"], dtype=np.uint8).tobytes()
                                       for _ in range(m)] for m in lengths], pa.list_(pa.binary()))
            code_times = np.concatenate([np.sort(t - rng.integers(-86_400_000_000, age_us, m))
                                         for t, m in zip(times, lengths, strict=True)])
            columns[CODE_TIMES_COLUMN] = pa.ListArray.from_arrays(
                pa.array(np.r_[0, np.cumsum(lengths)].astype(np.int32)),
                pa.array(code_times, pa.int64()).cast(pa.timestamp("us", "UTC")))
    columns["sequence_ds"] = columns[DAY_COLUMN]
    for label in LABEL_COLUMNS.values():
        columns[label] = pa.array(rng.integers(0, 2, n), pa.int32())
    return pa.table(columns)


@dataclass(frozen=True)
class ExportResult:
    path: str  # the artifact folder
    seconds: float  # torch.onnx.export's
    opset: int
    parity_rows: int
    max_abs_diff: float


def export_artifact(task: StudentTask, cfg: StudentConfig, tasks: tuple[str, ...], code_dim: int,
                    counters_start_ds: str, out: str | Path, lineage: dict[str, Any],
                    holdout: list[tuple[pa.Table, Batch]], sparse_features: tuple[str, ...] = SPARSE_FEATURES
                    ) -> ExportResult:
    """Export `task` (a student built from cfg for `tasks`) into the folder `out` (local or an object
    store URI): the graph, its spec, artifact.json with `lineage`, and the held-out feature rows of
    `holdout` ((example rows, their loader batch) pairs), which must score as the eager student does
    (`parity_holds`); ExportError otherwise (nothing is written then)."""
    if not holdout:
        raise ExportError("the export's parity check needs at least one held-out batch")
    graph = ServingStudent(task, sparse_features).eval()
    spec = student_spec(cfg, tasks, sparse_features, code_dim, counters_start_ds)
    with tempfile.TemporaryDirectory(prefix="gem-export-") as tmp:
        local = Path(tmp)
        seconds = export_onnx(graph, local / MODEL_FILE, code_dim // 2)
        opset = next(o.version for o in onnx.load(str(local / MODEL_FILE)).opset_import if o.domain in ("", "ai.onnx"))
        storage.write_json(str(local / SPEC_FILE), spec)
        rows = pa.concat_tables([feature_rows(t, b) for t, b in holdout], promote_options="permissive")
        with torch.no_grad():
            eager = torch.cat([task.logits(b) for _, b in holdout]).numpy()
        for j, task_name in enumerate(tasks):
            rows = rows.append_column(f"eager_{logit_column(task_name)}", pa.array(eager[:, j], pa.float32()))
        meta = {"name": lineage.get("student", "student"), "format": FORMAT, "model": MODEL_FILE,
                "runtime": {"onnxruntime": onnxruntime.__version__, "onnx_opset": opset,
                            "exported_with": {"torch": torch.__version__, "onnx": onnx.__version__}},
                "lineage": lineage, "export_seconds": round(seconds, 3)}
        storage.write_json(str(local / ARTIFACT_FILE), meta)
        scored = Artifact.load(str(local)).logits(rows)
        diff = float(np.abs(scored - eager).max()) if len(eager) else 0.0
        if not parity_holds(scored, eager):
            raise ExportError(f"the exported {meta['name']} scores its {rows.num_rows} held-out rows up to {diff:.3g} "
                              f"away from the eager student (tolerance {PARITY_ABS} + {PARITY_REL} x |logit|)")
        meta["parity"] = {"rows": rows.num_rows, "max_abs_diff": diff, "abs_tolerance": PARITY_ABS,
                          "rel_tolerance": PARITY_REL}
        storage.write_json(str(local / ARTIFACT_FILE), meta)
        pq.write_table(rows, local / HOLDOUT_FILE)
        storage.makedirs(out)
        for name in (MODEL_FILE, SPEC_FILE, HOLDOUT_FILE, ARTIFACT_FILE):  # artifact.json last: the folder is whole
            storage.write(storage.join(out, name), (local / name).read_bytes())
    return ExportResult(str(out), seconds, opset, rows.num_rows, diff)


class RowStream(StudentStream):
    """A StudentStream whose batches also carry their example rows (meta["rows"]), for feature rows."""

    def make_batch(self, table: pa.Table, mask: np.ndarray, weights: np.ndarray, meta: dict[str, Any],
                   spans: Any) -> Batch:
        batch = super().make_batch(table, mask, weights, meta, spans)
        batch.meta["rows"] = table
        return batch


def artifact_dir(root: str | Path, name: str, ds: str) -> str:
    """Where the distill stage writes the artifact of promotion `name` of day ds (beside the checkpoints)."""
    return storage.join(root, "serving", name, ds)


def export_student(cfg: GemConfig, inputs: DistillInputs, surface: str, trained: StudentRun, name: str, ds: str,
                   root: str | Path, previous: promotion.Promotion | None) -> ExportResult:
    """The distill stage's export of one promoted student (trained.task) with its lineage; the parity
    check scores the first held-out batches of inputs.eval_day (HOLDOUT_ROWS rows at most)."""
    tasks = tuple(trained.task.heads.tasks)
    student_cfg = dataclasses.replace(cfg.student, variant=trained.variant)
    seed = cfg.student_train.seed
    manifest = inputs.manifest(surface, tasks, inputs.eval_day, "eval", seed)
    signals = inputs.signals(cfg, tasks, [*inputs.train_days, inputs.eval_day])  # train_student's, read once
    stream = RowStream(manifest, tasks, cfg.loader.capped(student_cfg.dlrm.max_len), signals, rank=0, world_size=1)
    holdout: list[tuple[pa.Table, Batch]] = []
    for batch in ResumableLoader(stream).epoch():
        holdout.append((batch.meta.pop("rows"), batch))
        if sum(b.size for _, b in holdout) >= HOLDOUT_ROWS:
            break
    lineage = {
        "student": name, "variant": trained.variant, "surface": surface, "tasks": list(tasks), "run_ds": ds,
        "checkpoint": str(trained.checkpoint) if trained.checkpoint is not None else None, "steps": trained.steps,
        "training_days": list(inputs.train_days),
        "trained_through": promotion.newest_day([inputs.train_day, previous.trained_through if previous else None]),
        "warm_started_from": {"mix_ds": previous.mix_ds, "checkpoint": str(previous.checkpoint)} if previous else None,
        "eval_day": inputs.eval_day,
        "fm": {day: {"version": m.version, "model_ds": m.model_ds, "trained_through": m.trained_through}
               for day, m in sorted(inputs.fm_models.items())},
        "tables": {"silver.training_examples": inputs.examples[1], "silver.user_sequences": inputs.sequences[1],
                   "gold.fm_predictions": inputs.predictions_version, "gold.fm_history_codes": inputs.codes_version},
        "counters_start_ds": inputs.counters_start_ds,
    }
    return export_artifact(trained.task, student_cfg, tasks, cfg.model.history_codes.code_dim, inputs.counters_start_ds,
                           artifact_dir(root, name, ds), lineage, holdout)
