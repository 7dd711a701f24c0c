"""gem.quality.runner.project_lock: processes validating into one GX project take it one at a time.

GX's file stores are not safe for concurrent writers: a backfill's day 1 and the next daily run
ingesting at once fail with CheckpointRelatedResourcesFreshnessError. Real processes, real GX
(pandas batches, so no JVM)."""

from __future__ import annotations

import subprocess
import sys
import time

from gem import storage
from gem.quality.runner import project_lock, results_uri
from tests.support import REPO, make_config

VALIDATE = """
import sys
from pathlib import Path

import great_expectations.expectations as gxe
import pandas as pd

from gem.quality.runner import validate
from tests.support import make_config

cfg = make_config(Path(sys.argv[1]))
for i in range(int(sys.argv[3])):
    frame = pd.DataFrame({"user_id": [f"u{j}" for j in range(5 + i)]})
    report = validate(cfg, frame, "events.schema", [gxe.ExpectColumnValuesToNotBeNull(column="user_id", meta={"critical": True})],
                      batch_label=f"{sys.argv[2]}-{i}")
    assert report.success
print("validated", sys.argv[2])
"""


def _validate(tmp_path, label: str, times: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", VALIDATE, str(tmp_path), label, str(times)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_validation_waits_while_another_process_holds_the_project(tmp_path):
    cfg = make_config(tmp_path)
    with project_lock(cfg):
        waiting = _validate(tmp_path, "waiting", 1)
        time.sleep(15)  # long enough to import GX and reach the project
        assert waiting.poll() is None, waiting.communicate()[0][-3000:]
    out, _ = waiting.communicate(timeout=120)
    assert waiting.returncode == 0 and "validated waiting" in out, out[-3000:]


def test_two_processes_updating_the_same_suite_at_once_both_succeed(tmp_path):
    make_config(tmp_path)
    runs = [_validate(tmp_path, label, 12) for label in ("first", "second")]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    stored = [u for u in storage.walk_files(results_uri(make_config(tmp_path))) if u.endswith(".json")]
    assert len(stored) == 24, sorted(stored)
