"""Reports and Data Docs of a lakehouse on S3 (the local S3 API server): Great Expectations works in a
local copy of its project and publishes its Data Docs and results under `{lakehouse}/_dq/gx`, and
the run report is rendered locally and published under `{lakehouse}/_reports`, where a reader who
downloads the lakehouse finds a page that renders with its figures and its Data Docs links."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import great_expectations.expectations as gxe
import pandas as pd
import pytest

from gem import storage
from gem.lakehouse import completions
from gem.lakehouse.commit import StageContext
from gem.quality.runner import DOCS_SITE_DIR, RESULTS_DIR, build_data_docs, local_root, validate
from gem.report import run_report
from jobs import validate_events
from tests.browser import LinkParser, render
from tests.spark.test_quality import DS, clean_day, write_day
from tests.support import REPO, make_config

SITE = DOCS_SITE_DIR.as_posix()
RESULTS = RESULTS_DIR.as_posix()


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's temp folder, where its local copies of GX projects live: a fresh machine."""
    folder = tmp_path / "host"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _relative(uri: str, base: str) -> str:
    return storage.normalized(uri)[len(storage.normalized(base)) + 1:]


def _links(text: str) -> list[str]:
    parser = LinkParser()
    parser.feed(text)
    return parser.hrefs


# The Data Docs index lists its pages in a table its script fills from rows like this one.
_INDEX_ROW = re.compile(r"""'_table_row_link_path': '([^']+)'""")


def _index_pages(text: str) -> set[str]:
    """The result pages the index links, as paths: GX percent-encodes a run name's ':' in its links."""
    return {unquote(link) for link in _INDEX_ROW.findall(text)}


def test_validate_events_publishes_data_docs_and_results_on_s3(spark: Any, s3_bucket: str, tmp_path: Path,
                                                               host: Path) -> None:
    cfg = make_config(tmp_path, lakehouse_uri=s3_bucket + "/lake")
    assert cfg.gx_root == s3_bucket + "/lake/_dq/gx"
    write_day(spark, cfg, DS, clean_day(cfg.surfaces))
    summary = validate_events.run(StageContext(cfg), DS).details

    assert summary["success"]
    index = storage.join(cfg.gx_root, SITE, "index.html")
    assert summary["data_docs_index"] == index and storage.exists(index)
    (result,) = summary["results"].values()
    suite_results = storage.join(cfg.gx_root, RESULTS, *validate_events.STATISTICS_SUITE.split("."))
    assert storage.walk_files(suite_results) == [result]
    assert storage.read_json(result)["success"] is True
    page = storage.join(cfg.gx_root, SITE, "validations", _relative(result, storage.join(cfg.gx_root, RESULTS)))
    assert storage.exists(page.removesuffix(".json") + ".html")
    # The index links the result's page, and the site is offline: its vendored assets are published.
    assert _relative(page.removesuffix(".json") + ".html", storage.join(cfg.gx_root, SITE)) in _index_pages(
        storage.read_text(index))
    assert storage.walk_files(storage.join(cfg.gx_root, SITE, "static", "vendor"))
    # GX's own configuration stays in the local copy, under this machine's temp folder.
    assert host in local_root(cfg).parents and (local_root(cfg) / "great_expectations.yml").is_file()
    assert not storage.exists(storage.join(cfg.gx_root, "great_expectations.yml"))


VALIDATE = """
import sys
from pathlib import Path

import great_expectations.expectations as gxe
import pandas as pd

from gem.quality.runner import validate
from tests.support import make_config

cfg = make_config(Path(sys.argv[1]), lakehouse_uri=sys.argv[2])
for i in range(int(sys.argv[4])):
    frame = pd.DataFrame({"user_id": [f"u{j}" for j in range(5 + i)]})
    validate(cfg, frame, sys.argv[3], [gxe.ExpectColumnValuesToNotBeNull(column="user_id", meta={"critical": True})],
             batch_label=f"2026-01-0{i + 1}")
print("validated", sys.argv[3])
"""


def test_hosts_validating_different_suites_at_once_lose_no_result(s3_bucket: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes, each with its own temp folder (two machines' local copies), validate a suite
    each into one gx_root on S3 at the same time: every result and its page is published, and the
    index that a later build_data_docs on the first machine publishes links every one of them
    (results the other machine published meanwhile are fetched and the index re-rendered)."""
    lake = s3_bucket + "/lake"
    runs = {}
    for suite in ("hosts.first", "hosts.second"):
        machine = tmp_path / suite
        machine.mkdir()
        env = {**os.environ, "TMPDIR": str(machine)}
        runs[suite] = subprocess.Popen([sys.executable, "-c", VALIDATE, str(tmp_path), lake, suite, "3"], cwd=REPO,
                                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outputs = {suite: run.communicate(timeout=300)[0] for suite, run in runs.items()}
    assert [run.returncode for run in runs.values()] == [0, 0], "\n".join(o[-3000:] for o in outputs.values())

    cfg = make_config(tmp_path, lakehouse_uri=lake)
    results = storage.join(cfg.gx_root, RESULTS)
    stored = [_relative(u, results) for u in storage.walk_files(results) if u.endswith(".json")]
    assert sorted(r.split("/")[:3] for r in stored) == sorted(
        [suite.split(".") + [f"2026-01-0{i + 1}"] for suite in runs for i in range(3)])
    site = storage.join(cfg.gx_root, SITE)
    for rel in stored:
        assert storage.exists(storage.join(site, "validations", rel.removesuffix(".json") + ".html")), rel
    # One more result, published from the second machine after the first one's last validation.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "hosts.second"))
    late = validate(cfg, pd.DataFrame({"user_id": ["u1"]}), "hosts.late",
                    [gxe.ExpectColumnValuesToNotBeNull(column="user_id", meta={"critical": True})], "2026-01-04")
    stored.append(_relative(late.result_path, results))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "hosts.first"))
    first_index = (local_root(cfg) / SITE / "index.html").read_text()  # the first machine's copy, as it left it
    assert "hosts/late" not in first_index
    index = build_data_docs(cfg, rebuild=False)
    assert index == storage.join(site, "index.html")
    assert {f"validations/{rel.removesuffix('.json')}.html" for rel in stored} <= _index_pages(storage.read_text(index))


def test_the_run_report_of_a_lake_on_s3_is_published_and_renders(s3_bucket: str, tmp_path: Path, host: Path) -> None:
    cfg = make_config(tmp_path, lakehouse_uri=s3_bucket + "/lake")
    completions.publish_completion(cfg, "ingest_events", DS, "test", 105, 100, {"wrong_type": 5}, {})
    frame = pd.DataFrame({"user_id": ["u1", "u2", None]})
    validate(cfg, frame, "report.rules", [gxe.ExpectColumnValuesToNotBeNull(column="user_id", meta={"critical": True})],
             DS, raise_on_critical=False)

    index = run_report.write(cfg, DS)
    out = run_report.report_dir(cfg, DS)
    assert out == s3_bucket + f"/lake/_reports/runs/{DS}" and index == storage.join(out, "index.html")
    assert sorted(_relative(u, out) for u in storage.walk_files(out)) == [
        "img/quarantine.png", "img/rows_per_stage.png", "index.html"]
    # A rewrite replaces it whole on S3 too, and a prefix that is not a report is refused.
    assert run_report.write(cfg, DS) == index
    storage.write(storage.join(s3_bucket, "lake", "_reports", "runs", "2026-02-01", "notes.txt"), "keep")
    with pytest.raises(FileExistsError, match="not a report folder"):
        run_report.build(cfg, DS).write(storage.join(s3_bucket, "lake", "_reports", "runs", "2026-02-01"))

    local = tmp_path / "downloaded"
    storage.download_folder(cfg.lakehouse_uri, local)
    page_file = local / "_reports" / "runs" / DS / "index.html"
    page = render(page_file)
    assert page.title == f"GEM run report, ds={DS}"
    assert "ingest_events\twrong_type\t5\t105\t100" in page.text.replace(f"{DS}\t", "", 1)
    assert f"report.rules\t{DS}\tFAILED\t1\t1\t0\tData Docs" in page.text
    assert [img.src for img in page.images] == ["img/rows_per_stage.png", "img/quarantine.png"]
    assert all(img.loaded for img in page.images), page.images
    docs = [h for h in _links(page_file.read_text()) if "data_docs" in h]
    assert len(docs) == 1 and (page_file.parent / unquote(docs[0])).resolve().is_file(), docs
