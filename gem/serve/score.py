"""`gem score`: a student artifact scores feature rows with onnxruntime, in a process that never
imports the training code (gem.train, gem.model, gem.distill), torch or Spark.

    gem score --model ARTIFACT_DIR --input ROWS [--ds D] --out PREDICTIONS

ROWS: a Parquet file, a folder of Parquet files, or a Delta table (a folder with _delta_log; --ds
picks one day's partition). Its rows carry the columns of the artifact's feature_spec.json
(gem.serve.features); a row that breaks the contract stops the run with an error naming the column,
never a silent score. A lakehouse's silver.training_examples table is a day of examples: --ds names
the day, and the user histories and FM codes its rows only point at are joined from the lakehouse
(gem.serve.examples), as the training loader joins them. PREDICTIONS: a path ending in .parquet is
written as one Parquet file, anything else as a Delta table (with --ds, that day's partition is replaced). One row per input row, in
order: impression_id, ds and surface when the input has them, then per task the logit and the
probability (logit_<label type>, p_<label type>), and the artifact's name.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from deltalake import write_deltalake

from gem import storage
from gem.data.delta_log import read_table
from gem.serve.examples import feature_rows, lakehouse_of
from gem.serve.features import ArtifactError, check_spec, model_inputs

MODEL_FILE, SPEC_FILE, ARTIFACT_FILE, HOLDOUT_FILE = "model.onnx", "feature_spec.json", "artifact.json", "holdout.parquet"
PASSTHROUGH = ("impression_id", "ds", "surface")  # input columns copied to the predictions
BATCH_ROWS = 4096  # rows per graph call


class InputError(ValueError):
    """An input the scorer cannot read as asked (no such path, --ds on a table that is not Delta)."""


class EmptyInputError(InputError):
    """Nothing to score: the input (or its --ds partition) has no rows."""


def logit_column(task: str) -> str:
    return f"logit_{task.split('/')[1]}"


def probability_column(task: str) -> str:
    return f"p_{task.split('/')[1]}"


@dataclass
class Artifact:
    """A loaded artifact folder: its spec, its artifact.json and an onnxruntime session of its graph."""

    path: str
    spec: dict[str, Any]
    meta: dict[str, Any]
    session: onnxruntime.InferenceSession

    @classmethod
    def load(cls, path: str | Path, threads: int | None = None) -> Artifact:
        """threads: onnxruntime's intra-op threads (default: its own choice, the cores)."""
        path = str(path)
        for name in (MODEL_FILE, SPEC_FILE, ARTIFACT_FILE):
            if not storage.exists(storage.join(path, name)):
                raise ArtifactError(f"{path} is no student artifact: {name} is missing")
        spec = storage.read_json(storage.join(path, SPEC_FILE))
        check_spec(spec, path)
        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        session = onnxruntime.InferenceSession(storage.read_bytes(storage.join(path, MODEL_FILE)), options,
                                               providers=["CPUExecutionProvider"])
        return cls(path, spec, storage.read_json(storage.join(path, ARTIFACT_FILE)), session)

    @property
    def tasks(self) -> list[str]:
        return list(self.spec["tasks"])

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """(B, T) float32 logits of one batch of graph inputs (gem.serve.features.model_inputs)."""
        wanted = {i.name for i in self.session.get_inputs()}
        return self.session.run(["logits"], {k: v for k, v in inputs.items() if k in wanted})[0]

    def logits(self, rows: pa.Table, batch_rows: int = BATCH_ROWS) -> np.ndarray:
        """(n, T) float32 logits of feature rows; FeatureError naming a column that breaks the spec,
        EmptyInputError for no rows."""
        if rows.num_rows == 0:
            raise EmptyInputError("no rows to score")
        return np.concatenate([self.run(model_inputs(rows.slice(start, batch_rows), self.spec))
                               for start in range(0, rows.num_rows, batch_rows)])

    def predictions(self, rows: pa.Table) -> pa.Table:
        """The prediction table of feature rows (module docstring)."""
        logits = self.logits(rows)
        probabilities = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
        columns: dict[str, Any] = {c: rows[c] for c in PASSTHROUGH if c in rows.column_names}
        for j, task in enumerate(self.tasks):
            columns[logit_column(task)] = pa.array(logits[:, j], pa.float32())
            columns[probability_column(task)] = pa.array(probabilities[:, j].astype(np.float32), pa.float32())
        columns["model"] = pa.array([self.meta.get("name", self.path)] * rows.num_rows, pa.string())
        return pa.table(columns)


def is_delta(uri: str) -> bool:
    return storage.exists(storage.join(uri, "_delta_log"))


def read_rows(uri: str, ds: str | None = None, spec: dict[str, Any] | None = None) -> pa.Table:
    """Feature rows from a Parquet file or folder, or a Delta table (one day's partition with ds); from
    a lakehouse's silver.training_examples, day ds of the spec's surface joined with the histories and
    codes the spec names (gem.serve.examples)."""
    lakehouse = lakehouse_of(uri) if spec is not None and is_delta(uri) else None
    if lakehouse is not None:
        if ds is None:
            raise InputError(f"{uri} is a lakehouse's training examples: --ds names the day to score")
        rows = feature_rows(lakehouse, ds, spec)
        where = f"{uri} (ds={ds}, surface={spec['surface']})"
    elif is_delta(uri):
        rows = read_table(uri, where={"ds": ds} if ds else None)
        where = f"{uri} (ds={ds})" if ds else uri
    elif ds is not None:
        raise InputError(f"--ds picks a day of a Delta table; {uri} is not one (no _delta_log)")
    elif storage.exists(uri):
        rows = pq.read_table(uri) if uri.endswith(".parquet") else pads.dataset(uri, format="parquet").to_table()
        where = uri
    else:
        raise InputError(f"no input at {uri}")
    if rows.num_rows == 0:
        raise EmptyInputError(f"no rows to score in {where}")
    return rows


def write_predictions(predictions: pa.Table, uri: str, ds: str | None = None) -> None:
    """A .parquet path: one Parquet file; else a Delta table, partitioned by ds when the rows have it
    (with --ds, that day's partition is replaced; without, the table)."""
    if uri.endswith(".parquet"):
        storage.makedirs(storage.parent(uri))
        with storage.open_write(uri) as f:
            pq.write_table(predictions, f)
        return
    if "ds" in predictions.column_names and not pa.types.is_date(predictions["ds"].type):
        day = predictions["ds"].cast(pa.string()).to_pylist()
        predictions = predictions.set_column(predictions.column_names.index("ds"), "ds",
                                             pa.array([dt.date.fromisoformat(d[:10]) for d in day], pa.date32()))
    partitioned = "ds" in predictions.column_names
    predicate = f"ds = '{ds}'" if ds and partitioned and is_delta(uri) else None
    write_deltalake(storage.normalized(uri), predictions, mode="overwrite", predicate=predicate,
                    partition_by=["ds"] if partitioned else None, storage_options=storage.delta_storage_options(uri))


@dataclass(frozen=True)
class ScoreResult:
    rows: int
    seconds: float
    out: str


def score(model: str, input_uri: str, out: str, ds: str | None = None) -> ScoreResult:
    """The command's work: load the artifact, read the rows, score them, write the predictions."""
    started = time.perf_counter()
    artifact = Artifact.load(model)
    predictions = artifact.predictions(read_rows(input_uri, ds, artifact.spec))
    write_predictions(predictions, out, ds)
    return ScoreResult(predictions.num_rows, time.perf_counter() - started, out)

