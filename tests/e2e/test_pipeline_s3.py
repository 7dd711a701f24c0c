"""The lakehouse on an object store: the whole chain (generator, ingest .. validate_examples, mix,
pretrain, precompute, distill) over three small days by the bulk path, with `lakehouse_uri` on the
local S3 API server (moto, server mode) and the suite's Spark session reaching it through S3A.
Every stage succeeds or has nothing ready, the students are distilled on the third day, every
table, checkpoint, promotion pointer, lease folder and report lives in the bucket, and nothing is
written under the local folder the config would otherwise use. Slow tier (about five minutes): in
CI, `make cluster-demo` runs the demo's chain with its lakehouse on the same S3 API server."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gem import storage
from gem.lakehouse import tables
from gem.lakehouse.commit import StageContext
from gem.pipeline.bulk import run_range
from gem.pipeline.command import app
from gem.report import run_report
from schemas import TABLES
from tests.support import lakehouse_rows, make_config

pytestmark = pytest.mark.slow

DAYS = ("2026-01-01", "2026-01-03")


@pytest.fixture(scope="module")
def chain(spark, s3_server, tmp_path_factory: pytest.TempPathFactory):
    bucket = "gem-pipeline-s3"
    storage.filesystem("s3://").mkdir(bucket)
    tmp = tmp_path_factory.mktemp("pipeline-s3")
    cfg = make_config(
        tmp, lakehouse_uri=f"s3://{bucket}/lake", start_ds=DAYS[0], attribution_window_days=0,
        generator={"users": 300, "ads": 60, "advertisers": 12, "events_per_day": 3000, "chunk_impressions": 1500},
        mix={"cold_start_days": 0, "validation_days": 0},
        train={"steps": 8, "checkpoint_every": 8},
        student_train={"steps": 4, "export": False},
    )
    runs = list(run_range(cfg, *DAYS, ctx=StageContext(cfg, spark)))
    return cfg, runs, tmp


def test_every_stage_ran_on_the_object_store(chain) -> None:
    _cfg, runs, _ = chain
    assert {r.state for r in runs} <= {"success", "skipped"}, runs
    ran = {(r.stage, r.run_day) for r in runs if r.state == "success"}
    for stage in ("ingest_events", "assemble_examples", "mix", "pretrain", "precompute", "distill"):
        assert any(s == stage for s, _ in ran), (stage, runs)
    assert ("distill", DAYS[-1]) in ran


def test_tables_and_files_live_in_the_bucket(chain) -> None:
    cfg, _, tmp = chain
    filled = [name for name in TABLES if lakehouse_rows(cfg, name)]
    assert len(filled) >= 12, filled
    for name in filled:
        assert tables.table_path(cfg, TABLES[name]).startswith("s3://")
    files = storage.walk_files(cfg.lakehouse_uri)
    for prefix in ("_landing/", "_checkpoints/promoted/", "_ops/", "_generator/state/", "gold/fm_user_embeddings/"):
        assert any(f.startswith(f"{cfg.lakehouse_uri}/{prefix}") for f in files), prefix
    assert not (Path(tmp) / "lakehouse").exists()


def test_the_run_report_publishes_on_the_object_store(chain) -> None:
    cfg, _, _ = chain
    index = run_report.write(cfg, DAYS[-1])
    assert index.startswith(f"{cfg.lakehouse_uri}/_reports/") and "<html" in storage.read_text(index).lower()


def test_the_gem_command_reads_the_lakehouse_on_the_object_store(chain, tmp_path: Path) -> None:
    """`gem status` lists the days' records and `gem report` writes the day's page, both from the
    bucket, with nothing but the config file naming it."""
    cfg, _, _ = chain
    config = tmp_path / "gem.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    status = CliRunner().invoke(app, ["status", "--config", str(config), "--no-airflow"])
    assert status.exit_code == 0, status.output
    for stage in ("ingest_events", "precompute", "distill"):
        assert stage in status.output, status.output
    report = CliRunner().invoke(app, ["report", "--ds", DAYS[-1], "--config", str(config)])
    assert report.exit_code == 0, report.output
    page = report.output.strip().splitlines()[-1]
    assert page.startswith(f"{cfg.lakehouse_uri}/_reports/") and "<html" in storage.read_text(page).lower()
