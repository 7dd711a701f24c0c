"""The `gem` command (gem/pipeline/command.py): installed as a console script, every subcommand with --help,
bad input as usage errors, import-movielens and status on real files and records. The subcommands
that run Airflow are exercised for real in tests/e2e/test_gem_command.py."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gem.lakehouse import completions
from gem.lakehouse.landing import completed_manifest
from gem.pipeline.command import app
from tests.support import FIXTURES, PYTHON, REPO, make_config, subprocess_env

SUBCOMMANDS = {"run": ["--ds", "--config"], "status": ["--start", "--end", "--config", "--airflow"],
               "backfill": ["--start", "--end", "--from-stage", "--reprocess", "--config"],
               "import-movielens": ["PATH", "--config", "--summary"], "delete-user": ["USER_ID", "--config"]}
# What the `gem` command imports before a subcommand runs: none of these (each subcommand imports its
# modules when it runs, gem/pipeline/command.py).
HEAVY = {"torch", "torchrec", "pyspark", "airflow", "deltalake", "pyarrow", "pandas", "numpy", "great_expectations",
         "matplotlib"}
# `python -c PROBE OUT ARGS...`: runs `gem ARGS...` and writes the top-level packages its process
# imported, as it exits, to the file OUT.
IMPORTS_PROBE = (
    "import atexit, json, runpy, sys\n"
    "out = sys.argv.pop(1)\n"
    "atexit.register(lambda: open(out, 'w').write(json.dumps(sorted({m.split('.')[0] for m in sys.modules}))))\n"
    "runpy.run_module('gem', run_name='__main__', alter_sys=True)\n"
)


def _cfg_file(tmp_path: Path, **extra: str) -> Path:
    path = tmp_path / "gem.yaml"
    path.write_text("".join(f"{k}: '{v}'\n" for k, v in {"lakehouse_uri": str(tmp_path / "lake"), **extra}.items()))
    return path


def test_the_console_script_is_gem_command_main() -> None:
    """pyproject declares `gem` (installed by `make setup`); `python -m gem` is the same command."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"gem": "gem.pipeline.command:main"}
    out = subprocess.run([PYTHON, "-m", "gem", "--help"], cwd=REPO, env=subprocess_env(), capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Usage: gem ") and all(name in out.stdout for name in SUBCOMMANDS)


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_has_help(name: str) -> None:
    result = CliRunner().invoke(app, [name, "--help"], prog_name="gem")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: gem {name} ")
    assert all(option in result.output.upper() if option == "PATH" else option in result.output
               for option in SUBCOMMANDS[name]), result.output


@pytest.mark.parametrize("args", [["run", "--ds", "2026-02-30"], ["status", "--start", "01/02/2026"],
                                  ["backfill", "--start", "2026-01-01", "--end", "2026-13-01"]])
def test_a_bad_day_is_a_usage_error(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "must be a day written YYYY-MM-DD" in result.output


@pytest.mark.parametrize(("extra", "message"), [
    (["--end", "2026-01-01"], "is before --start"),
    (["--end", "2026-01-03", "--from-stage", "build_featrues"], "not a stage; the stages in order: generate_events"),
    (["--end", "2026-01-03", "--reprocess", "all"], "one of completed, failed, none"),
])
def test_backfill_refuses_bad_arguments_before_touching_airflow(extra: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["backfill", "--start", "2026-01-02", *extra])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split()), result.output


def test_import_movielens_lands_one_marked_partition_per_day(tmp_path: Path) -> None:
    cfg_file = _cfg_file(tmp_path)
    result = CliRunner().invoke(app, ["import-movielens", str(FIXTURES / "movielens" / "ml-1m"),
                                      "--config", str(cfg_file)])
    assert result.exit_code == 0, result.output
    landing = str(tmp_path / "lake" / "_landing")
    # The fixture's three rating days (tests/unit/test_import_movielens.py counts them by hand).
    for day, impressions in {"2000-12-29": 4, "2000-12-30": 3, "2000-12-31": 3}.items():
        manifest = completed_manifest(landing, day)
        assert manifest is not None and manifest["events_by_type"]["impression"] == impressions, (day, manifest)


def test_import_movielens_names_a_broken_file(tmp_path: Path) -> None:
    broken = tmp_path / "ml-1m"
    broken.mkdir()
    for name in ("movies.dat", "users.dat"):
        (broken / name).write_bytes((FIXTURES / "movielens" / "ml-1m" / name).read_bytes())
    (broken / "ratings.dat").write_text("1::1::5::978300760\n1::2::five::978300761\n")
    result = CliRunner().invoke(app, ["import-movielens", str(broken), "--config", str(_cfg_file(tmp_path))])
    assert result.exit_code == 1
    assert "ratings.dat" in result.output and ":2" in result.output, result.output


def test_status_lists_the_records_and_says_when_airflow_has_no_db(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_config(tmp_path, start_ds="2026-01-01")
    completions.publish_completion(cfg, "ingest_events", "2026-01-01", "ingest_events:2026-01-01", None, 0, {},
                                   {"bronze.ad_events": 1}, {}, reconciliation="test: versions only")
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow_home"))
    cfg_file = _cfg_file(tmp_path, start_ds="2026-01-01", lakehouse_uri=cfg.lakehouse_uri)
    result = CliRunner().invoke(app, ["status", "--end", "2026-01-02", "--config", str(cfg_file)])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split()[1:] for line in result.output.splitlines() if line.strip()}
    assert rows["ingest_events"] == ["done", "missing"] and rows["validate_events"] == ["missing", "missing"]
    assert f"Airflow: no metadata DB in {tmp_path / 'airflow_home'} yet" in result.output


def test_status_names_a_running_backfill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gem.lakehouse.backfill_hold import hold

    cfg = make_config(tmp_path, start_ds="2026-01-01")
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow_home"))
    cfg_file = _cfg_file(tmp_path, start_ds="2026-01-01", lakehouse_uri=cfg.lakehouse_uri)
    args = ["status", "--end", "2026-01-04", "--no-airflow", "--config", str(cfg_file)]
    with hold(cfg, "2026-01-01", "2026-01-03", "backfill-test"):
        running = CliRunner().invoke(app, args)
    assert running.exit_code == 0, running.output
    assert "backfill 2026-01-01..2026-01-03 running (backfill-test" in running.output
    assert "backfill 2026-01-01" not in CliRunner().invoke(app, args).output


def test_rerun_all_starts_at_the_earliest_stale_stage_over_the_stale_days() -> None:
    from gem.pipeline.command import rerun_all

    lines = ["mix ds=2026-01-04: validate_examples ds=2026-01-02 now names ...; rerun `...` first",
             "build_features ds=2026-01-03: build_features ds=2026-01-02 now names ...; rerun `...` first",
             "pretrain ds=2026-01-05: its input mix ds=2026-01-05 is stale: ...; rerun `...` first"]
    assert rerun_all(lines) == "gem backfill --start 2026-01-03 --end 2026-01-05 --from-stage build_features"


def test_delete_user_prints_what_it_removed_and_refuses_an_empty_id(tmp_path: Path) -> None:
    from tests.landing_lines import line, write_day

    cfg_file = _cfg_file(tmp_path)
    write_day(str(tmp_path / "lake" / "_landing"), "2026-01-01", [line("e1", user_id="u9"), line("e2", user_id="u1")])
    result = CliRunner().invoke(app, ["delete-user", "u9", "--config", str(cfg_file)])
    assert result.exit_code == 0, result.output
    assert "deleted user 'u9'" in result.output and "ds=2026-01-01/part-0.json.gz" in result.output
    again = CliRunner().invoke(app, ["delete-user", "u9", "--config", str(cfg_file)])
    assert "nothing held this user" in again.output
    empty = CliRunner().invoke(app, ["delete-user", " ", "--config", str(cfg_file)])
    assert empty.exit_code == 2 and "user id" in empty.output


def _gem_imports(tmp_path: Path, *args: str) -> set[str]:
    """The top-level packages a `gem ARGS...` process has imported when it exits."""
    out = tmp_path / "imported.json"
    env = subprocess_env() | {"AIRFLOW_HOME": str(tmp_path / "airflow_home")}
    done = subprocess.run([PYTHON, "-c", IMPORTS_PROBE, str(out), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return set(json.loads(out.read_text()))


@pytest.mark.parametrize("args", [["--help"], *([name, "--help"] for name in sorted(SUBCOMMANDS))])
def test_the_command_and_its_help_import_no_heavy_library(tmp_path: Path, args: list[str]) -> None:
    assert _gem_imports(tmp_path, *args) & HEAVY == set()


def test_status_reads_the_lakehouse_without_spark_torch_or_airflow(tmp_path: Path) -> None:
    """`gem status` reads records through deltalake alone: no JVM, no torch, no Airflow import."""
    imported = _gem_imports(tmp_path, "status", "--end", "2026-01-02", "--config", str(_cfg_file(tmp_path)))
    assert "gem" in imported and "deltalake" in imported
    assert imported & {"torch", "torchrec", "pyspark", "airflow", "great_expectations", "matplotlib"} == set()
