"""The distill stage ships each promoted student as a serving artifact, on the distill tests' small real
lakehouse (precompute on days 2 and 3, the students of day 3 trained on day 2).

What is checked: each surface's artifact folder holds the graph, the feature spec, the held-out rows
and artifact.json with the runtime and the lineage (the FM model of each day read, the training
day, the input table versions the stage pinned); the export's seconds are in the stage's result;
the held-out loader batches score within 1e-5 through the artifact (feature rows -> gem.serve.score)
and the eager student; `gem score` scores those rows from a Delta table's day, and a day of the
lakehouse's examples with the histories and codes joined as the loader joins them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from typer.testing import CliRunner

from gem.data.delta_log import read_table
from gem.distill.run import promotion_name, surface_tasks
from gem.distill.run import run as distill
from gem.lakehouse import completions
from gem.lakehouse.commit import StageContext
from gem.pipeline.command import app
from gem.precompute.run import run as precompute
from gem.serve.export import artifact_dir
from gem.serve.score import logit_column
from gem.train.daily import checkpoint_root
from schemas.examples import SILVER_TRAINING_EXAMPLES
from tests.precompute_lakehouse import build_days, precompute_config, promote_model, publish_training_records

# The lakehouse's precompute runs its shard tasks on the suite's Spark session; the stage itself
# trains two students and exports them (the quick tier's tests/spark/test_distill.py runs the same).
pytestmark = [pytest.mark.usefixtures("spark"), pytest.mark.slow]


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cfg = precompute_config(tmp_path_factory.mktemp("serve"))
    cfg = cfg.replace(student_train={**dataclasses.asdict(cfg.student_train), "export": True})
    _, days = build_days(cfg, 3, users=60)
    promote_model(cfg, days[1])
    publish_training_records(cfg, days[2])
    for ds in days[1:]:
        precompute(StageContext(cfg), ds)
    return {"cfg": cfg, "days": days, "result": distill(StageContext(cfg), days[2])}


def test_each_promoted_student_ships_with_its_spec_runtime_and_lineage(lake: dict[str, Any]) -> None:
    cfg, (_, day2, day3), result = lake["cfg"], lake["days"], lake["result"]
    assert completions.completion(cfg, "distill", day3) is not None
    for surface, details in result.details["surfaces"].items():
        assert details["promoted"]  # the first students: nothing promoted before them
        name = promotion_name(cfg.student.variant, surface)
        folder = Path(artifact_dir(checkpoint_root(cfg), name, day3))
        assert details["serving"]["artifact"] == str(folder) and details["serving"]["export_s"] > 0
        assert {p.name for p in folder.iterdir()} == {"model.onnx", "feature_spec.json", "artifact.json",
                                                     "holdout.parquet"}
        meta = json.loads((folder / "artifact.json").read_text())
        spec = json.loads((folder / "feature_spec.json").read_text())
        assert spec["tasks"] == list(surface_tasks(cfg, surface)) and spec["counters_start_ds"] == cfg.start_ds
        lineage = meta["lineage"]
        assert lineage["student"] == name and lineage["run_ds"] == day3 and lineage["training_days"][-1] == day2
        assert lineage["trained_through"] == day2 and lineage["eval_day"] == day3
        assert {d: m["trained_through"] for d, m in lineage["fm"].items()} == result.details["fm_trained_through"]
        assert set(lineage["tables"]) == {"silver.training_examples", "silver.user_sequences", "gold.fm_predictions",
                                          "gold.fm_history_codes"}
        assert all(isinstance(v, int) for v in lineage["tables"].values())
        assert meta["runtime"]["onnx_opset"] >= 18 and meta["parity"]["max_abs_diff"] <= 1e-5


def test_gem_score_scores_a_delta_day_of_the_held_out_rows_as_the_eager_student(lake: dict[str, Any],
                                                                               tmp_path: Path) -> None:
    cfg, day3 = lake["cfg"], lake["days"][2]
    surface = min(lake["result"].details["surfaces"])
    folder = artifact_dir(checkpoint_root(cfg), promotion_name(cfg.student.variant, surface), day3)
    rows = pq.read_table(Path(folder) / "holdout.parquet")
    write_deltalake(str(tmp_path / "requests"), rows.append_column("ds", pa.array([day3] * rows.num_rows)),
                    partition_by=["ds"])
    result = CliRunner().invoke(app, ["score", "--model", folder, "--input", str(tmp_path / "requests"), "--ds", day3,
                                      "--out", str(tmp_path / "predictions")])
    assert result.exit_code == 0, result.output
    scored = read_table(str(tmp_path / "predictions"), where={"ds": day3})
    assert scored["impression_id"].to_pylist() == rows["impression_id"].to_pylist()
    for task in surface_tasks(cfg, surface):
        column = logit_column(task)
        assert np.abs(scored[column].to_numpy() - rows[f"eager_{column}"].to_numpy()).max() <= 1e-5


def test_gem_score_scores_a_day_of_the_lakehouse_examples_as_the_eager_student(lake: dict[str, Any],
                                                                              tmp_path: Path) -> None:
    """The lakehouse's training examples of the held-out day, histories and FM codes joined by
    gem.serve.examples: every example of the surface is scored, and the held-out rows the stage's
    parity check scored (the loader's batches) come out within 1e-5 of the eager student."""
    cfg, day3 = lake["cfg"], lake["days"][2]
    for surface in sorted(lake["result"].details["surfaces"]):
        folder = artifact_dir(checkpoint_root(cfg), promotion_name(cfg.student.variant, surface), day3)
        examples = SILVER_TRAINING_EXAMPLES.path(cfg.lakehouse_uri)
        out = tmp_path / f"{surface}.parquet"
        result = CliRunner().invoke(app, ["score", "--model", folder, "--input", examples, "--ds", day3, "--out", str(out)])
        assert result.exit_code == 0, result.output
        day = read_table(examples, where={"ds": day3, "surface": surface})
        scored = pq.read_table(out)
        assert sorted(scored["impression_id"].to_pylist()) == sorted(day["impression_id"].to_pylist())
        held_out = pq.read_table(Path(folder) / "holdout.parquet")
        at = {i: k for k, i in enumerate(scored["impression_id"].to_pylist())}
        rows = np.array([at[i] for i in held_out["impression_id"].to_pylist()])
        for task in surface_tasks(cfg, surface):
            column = logit_column(task)
            assert np.abs(scored[column].to_numpy()[rows] - held_out[f"eager_{column}"].to_numpy()).max() <= 1e-5
    without_day = CliRunner().invoke(app, ["score", "--model", folder, "--input", examples, "--out", str(tmp_path / "x")])
    assert without_day.exit_code == 1 and "--ds names the day to score" in without_day.output
