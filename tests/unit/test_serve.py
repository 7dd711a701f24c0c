"""A promoted student as a serving artifact (gem.serve): a tiny LoopFM student exported once to ONNX.

What is checked: the artifact scores held-out feature rows within 1e-5 of the eager student, whose
inputs the training loader's own encoding builds (gem.data.loader.example_batch), at batch sizes 1
to 64 and with histories and code lists longer than the model reads, codes too old, at and after the
request; the serving graph equals the eager student for every variant; the artifact folder holds
its feature spec, runtime and lineage; `gem score` reads a Parquet file and a Delta table's day,
writes Parquet and Delta, in a process that imports no training code, torch or Spark; and bad
input (a missing column, a wrong dtype, a negative id, codes without their times, rows of another
surface, an empty input) stops it with an error naming the column, while unknown ids and ids beyond
the buckets score as the feature spec says.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from deltalake import write_deltalake
from typer.testing import CliRunner

from gem.data.delta_log import read_table
from gem.data.encode import DENSE_COLUMNS
from gem.data.loader import SPARSE_FEATURES
from gem.model.configs import (
    STUDENT_VARIANTS,
    DLRMConfig,
    EmbeddingConfig,
    HeadConfig,
    HistoryCodeFeatureConfig,
    StudentConfig,
)
from gem.model.student import StudentTask, build_student
from gem.pipeline.command import app
from gem.serve import export
from gem.serve.features import FeatureError, model_inputs
from gem.serve.score import Artifact, EmptyInputError, logit_column
from tests.support import PYTHON, REPO, subprocess_env

TASKS = ("reels/click", "reels/lead")
CODE_DIM = 8
START = "2026-01-01"
BUCKETS = {"user_id": 97, "ad_id": 50, "advertiser_id": 20, "campaign_id": 30, "surface": 8, "objective": 8,
           "creative_type": 8, "position": 65}
LINEAGE = {"student": "student-kd_loopfm-reels", "run_ds": "2026-01-05", "training_days": ["2026-01-02"]}


def tiny_config(variant: str = "kd_loopfm") -> StudentConfig:
    """The smallest student of the shape the stage trains: every feature, three histories, codes."""
    return StudentConfig(
        variant=variant,
        dlrm=DLRMConfig(dim=8, dense_arch=(16, 8), over_arch=(16, 8), max_len={"impression": 4, "click": 3, "conversion": 2}),
        embeddings=EmbeddingConfig(dim=8, buckets=BUCKETS), heads=HeadConfig(hidden=8, shared_experts=1),
        history_codes=HistoryCodeFeatureConfig(max_codes=3, max_age_days=2.0))


def tiny_student(variant: str = "kd_loopfm") -> StudentTask:
    torch.manual_seed(0)
    task = build_student(tiny_config(variant), TASKS, SPARSE_FEATURES, len(DENSE_COLUMNS), CODE_DIM).eval()
    with torch.no_grad():  # towers start at zero (every logit its bias): give the features a say
        task.heads.towers.normal_()
    return task


def eager_logits(task: StudentTask, rows: pa.Table) -> np.ndarray:
    with torch.no_grad():
        return task.logits(export.rows_batch(rows, TASKS, START)).numpy()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    task = tiny_student()
    spec = export.student_spec(tiny_config(), TASKS, SPARSE_FEATURES, CODE_DIM, START)
    holdout = export.synthetic_rows(spec, 48, seed=1)
    path = tmp_path_factory.mktemp("artifact") / "student-kd_loopfm-reels" / "2026-01-05"
    result = export.export_artifact(task, tiny_config(), TASKS, CODE_DIM, START, path, LINEAGE,
                                    [(holdout, export.rows_batch(holdout, TASKS, START))])
    return {"task": task, "spec": spec, "path": path, "result": result, "artifact": Artifact.load(path)}


def test_the_artifact_scores_held_out_rows_as_the_eager_student(exported: dict[str, Any]) -> None:
    task, spec, artifact = exported["task"], exported["spec"], exported["artifact"]
    rows = export.synthetic_rows(spec, 64, seed=2)
    assert max(len(h) for h in rows["history_impression"].to_pylist()) > 4  # longer than the body reads
    assert max(len(c) for c in rows["fm_codes"].to_pylist()) > 3  # more codes than max_codes
    for n in (1, 7, 64):
        diff = np.abs(artifact.logits(rows.slice(0, n)) - eager_logits(task, rows.slice(0, n)))
        assert diff.max() <= 1e-5, (n, diff.max())
    scored = artifact.predictions(rows)
    assert scored["impression_id"].to_pylist() == rows["impression_id"].to_pylist()
    p = scored["p_click"].to_numpy()
    assert np.allclose(p, 1 / (1 + np.exp(-scored["logit_click"].to_numpy())), atol=1e-6)
    assert np.unique(p.round(6)).size > 32  # the scores do depend on the rows
    # The export's own check, on its held-out rows, written beside the graph.
    assert exported["result"].max_abs_diff <= 1e-5 and exported["result"].parity_rows == 48
    holdout = pq.read_table(exported["path"] / "holdout.parquet")
    assert np.abs(artifact.logits(holdout)[:, 0] - holdout["eager_logit_click"].to_numpy()).max() <= 1e-5


@pytest.mark.parametrize("variant", sorted(STUDENT_VARIANTS))
def test_the_serving_graph_is_the_eager_student_for_every_variant(variant: str) -> None:
    """ServingStudent in torch (the function the artifact holds) against the eager student."""
    task = tiny_student(variant)
    spec = export.student_spec(tiny_config(variant), TASKS, SPARSE_FEATURES, CODE_DIM, START)
    rows = export.synthetic_rows(spec, 33, seed=3)
    graph = export.ServingStudent(task, SPARSE_FEATURES)
    inputs = model_inputs(rows, spec)
    with torch.no_grad():
        logits, _ = graph(*(torch.from_numpy(inputs[n]) for n in graph.input_names()))
    assert np.abs(logits.numpy() - eager_logits(task, rows)).max() <= 1e-5


def test_the_folder_holds_the_spec_the_runtime_and_the_lineage(exported: dict[str, Any]) -> None:
    path = exported["path"]
    spec = json.loads((path / "feature_spec.json").read_text())
    meta = json.loads((path / "artifact.json").read_text())
    columns = {c["name"]: c for c in spec["columns"]}
    assert columns["user_id"]["kind"] == "hashed_id" and columns["user_id"]["buckets"] == 97
    assert columns["objective"]["unknown"] == 0 and "unheard_of" not in columns["objective"]["vocabulary"]
    assert columns["history_impression"]["max_len"] == 4 and columns["fm_codes"]["code_bytes"] == CODE_DIM // 2
    assert {"unknown_id", "missing_column", "wrong_dtype", "empty_input"} <= set(spec["behaviour"])
    assert [i["name"] for i in spec["inputs"]] == [i.name for i in exported["artifact"].session.get_inputs()]
    assert meta["format"] == "onnx" and meta["runtime"]["onnx_opset"] >= 18
    assert meta["runtime"]["onnxruntime"] == exported["artifact"].meta["runtime"]["onnxruntime"]
    assert meta["lineage"] == LINEAGE and meta["export_seconds"] > 0
    assert meta["parity"]["max_abs_diff"] <= meta["parity"]["abs_tolerance"] == 1e-5


def test_gem_score_imports_no_training_code_torch_nor_spark(exported: dict[str, Any], tmp_path: Path) -> None:
    """One process scores a Parquet file into Parquet and a Delta table's day into Delta, through the
    `gem` command, then lists what it imported."""
    spec, artifact = exported["spec"], exported["artifact"]
    rows = export.synthetic_rows(spec, 40, seed=4)
    pq.write_table(rows, tmp_path / "rows.parquet")
    days = pa.array(["2026-01-05"] * 25 + ["2026-01-06"] * 15)
    write_deltalake(str(tmp_path / "rows_delta"), rows.append_column("ds", days), partition_by=["ds"])
    script = f"""
import json, sys
from gem.pipeline.command import app
for args in (["--input", {str(tmp_path / 'rows.parquet')!r}, "--out", {str(tmp_path / 'out.parquet')!r}],
             ["--input", {str(tmp_path / 'rows_delta')!r}, "--ds", "2026-01-06", "--out", {str(tmp_path / 'out_delta')!r}]):
    app(["score", "--model", {str(exported['path'])!r}, *args], prog_name="gem", standalone_mode=False)
print(json.dumps(sorted(sys.modules)))
"""
    done = subprocess.run([PYTHON, "-c", script], cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    modules = json.loads(done.stdout.strip().splitlines()[-1])
    forbidden = [m for m in modules if m.split(".")[0] in ("torch", "pyspark")
                 or m.startswith(("gem.train", "gem.model", "gem.distill"))]
    assert not forbidden, forbidden
    assert "onnxruntime" in modules and "gem.serve.score" in modules
    expected = artifact.logits(rows)
    scored = pq.read_table(tmp_path / "out.parquet")
    assert np.array_equal(scored[logit_column(TASKS[0])].to_numpy(), expected[:, 0])
    day = read_table(str(tmp_path / "out_delta"), where={"ds": "2026-01-06"})
    assert day.num_rows == 15 and day["impression_id"].to_pylist() == rows["impression_id"].to_pylist()[25:]
    assert np.array_equal(day[logit_column(TASKS[1])].to_numpy(), expected[25:, 1])


def _without(rows: pa.Table, name: str) -> pa.Table:
    return rows.drop_columns([name])


def _replaced(rows: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return rows.set_column(rows.column_names.index(name), name, values)


def test_bad_input_is_an_error_naming_the_column(exported: dict[str, Any]) -> None:
    spec, artifact = exported["spec"], exported["artifact"]
    rows = export.synthetic_rows(spec, 12, seed=5)
    n = rows.num_rows
    cases = {
        "ad_id": _without(rows, "ad_id"),  # a missing feature column
        DENSE_COLUMNS[3]: _replaced(rows, DENSE_COLUMNS[3], pa.array(["3"] * n)),  # a counter as text
        "position": _replaced(rows, "position", pa.array([1.5] * n)),  # a float position
        "campaign_id": _replaced(rows, "campaign_id", pa.array([-4] * n, pa.int64())),  # a negative hashed id
        "objective": _replaced(rows, "objective", pa.array([3] * n, pa.int64())),  # a vocabulary as an index
        "history_click": _replaced(rows, "history_click", pa.array([1.0] * n)),  # not a list
        "fm_code_times": _replaced(rows, "fm_code_times", pa.array([[]] * n, pa.list_(pa.timestamp("us")))),
        "surface": _replaced(rows, "surface", pa.array(["fb_feed"] * n)),  # another surface's requests
        "features_ds": _replaced(rows, "features_ds", pa.array(["2026-01-20"] * n)),
    }
    for column, bad in cases.items():
        with pytest.raises(FeatureError, match=f"column '{column}'") as raised:
            artifact.logits(bad)
        assert raised.value.column == column
    with pytest.raises(EmptyInputError, match="no rows"):
        artifact.logits(rows.slice(0, 0))


def test_unknown_ids_score_as_the_spec_says(exported: dict[str, Any]) -> None:
    """An id never seen hashes into the table; an integer id beyond the buckets is taken modulo them;
    an unknown vocabulary value is the unknown row, as null is; a null history is an empty one."""
    spec, artifact = exported["spec"], exported["artifact"]
    rows = export.synthetic_rows(spec, 8, seed=6)
    n = rows.num_rows
    base = artifact.logits(_replaced(rows, "user_id", pa.array([5] * n, pa.int64())))
    beyond = artifact.logits(_replaced(rows, "user_id", pa.array([5 + 97 * 1_000_003] * n, pa.int64())))
    assert np.array_equal(base, beyond)
    never_seen = artifact.logits(_replaced(rows, "user_id", pa.array(["a user no one has seen"] * n)))
    assert np.isfinite(never_seen).all()
    unknown = artifact.logits(_replaced(rows, "objective", pa.array(["unheard_of"] * n)))
    null = artifact.logits(_replaced(rows, "objective", pa.nulls(n, pa.string())))
    assert np.array_equal(unknown, null)
    empty = artifact.logits(_replaced(rows, "history_click", pa.array([[]] * n, pa.list_(pa.string()))))
    missing = artifact.logits(_replaced(rows, "history_click", pa.nulls(n, pa.list_(pa.string()))))
    assert np.array_equal(empty, missing)


def test_the_command_reports_bad_input_and_exits_1(exported: dict[str, Any], tmp_path: Path) -> None:
    rows = export.synthetic_rows(exported["spec"], 5, seed=7)
    pq.write_table(_without(rows, "ad_id"), tmp_path / "missing.parquet")
    pq.write_table(rows.filter(pc.equal(rows["surface"], "nowhere")), tmp_path / "empty.parquet")
    runner = CliRunner()
    for name, message in (("missing.parquet", "column 'ad_id': missing from the input"),
                          ("empty.parquet", "no rows to score")):
        result = runner.invoke(app, ["score", "--model", str(exported["path"]), "--input", str(tmp_path / name),
                                     "--out", str(tmp_path / "out.parquet")])
        assert result.exit_code == 1 and message in result.output, result.output
    assert not (tmp_path / "out.parquet").exists()


def test_parity_allows_float32_rounding_that_grows_with_the_logit_and_nothing_more() -> None:
    """An undertrained student's logits reach tens, where float32 rounds in steps of about 1e-6 and two
    runtimes' sums differ by more than 1e-5; near zero the bound stays 1e-5; NaN never passes."""
    from gem.serve.export import parity_holds

    eager = np.array([[50.0, -0.1]], dtype=np.float32)
    assert parity_holds(eager + np.array([[9e-5, 0.0]], dtype=np.float32), eager)
    assert not parity_holds(eager + np.array([[0.0, 9e-5]], dtype=np.float32), eager)
    assert not parity_holds(eager + np.array([[1e-3, 0.0]], dtype=np.float32), eager)
    assert not parity_holds(np.array([[np.nan, -0.1]], dtype=np.float32), eager)
