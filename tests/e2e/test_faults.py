"""A small fault drill (drills.faults): ingestion and pretraining killed with SIGKILL mid-run.

Two kill points spread over each job's run, plus pretraining killed inside a checkpoint save. After
each kill no unit of commit holds partial rows and no record claims the day; after a rerun every
table equals an uninterrupted run's, and the resumed training's per-step losses equal it bit for bit.
`python -m drills.faults` runs every stage with 20 kills.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from drills import faults

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


def test_killed_stages_leave_nothing_partial_and_reruns_converge(tmp_path: Path, capsys) -> None:
    code = faults.main(["--kills", "2", "--stages", "ingest_events,pretrain", "--days", "3",
                        "--root", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    table = {m.group(1): tuple(int(x) for x in m.group(2, 3, 4))
             for m in re.finditer(r"^  (\w+)\s+(\d+)\s+(\d+)\s+(\d+)\s+[\d.]+s", out, re.MULTILINE)}
    assert table["ingest_events"][0] == 2 and table["pretrain"][0] == 4  # + the kills in the 1st and 2nd save
    for stage, (trials, landed, survived) in table.items():
        assert landed >= 1 and survived == trials, (stage, out)
    assert re.search(r"pretrain killed at checkpoint:shards_written \(resumable from step 0\): landed; survived", out)
    # In the second save: a good checkpoint (step 6, TRAIN's checkpoint_every) beside the half-written one.
    assert re.search(r"pretrain killed at checkpoint:shards_written@2 \(resumable from step 6\): landed; survived", out)
    assert "all survived" in out
