"""Training checkpoints in a run folder on an object store (the local S3 API, moto, server mode):
written and read through fsspec, published by extra.json created last, resumed exactly after a kill,
a killed writer's partial folder ignored and removed, a corrupt checkpoint set aside without a
rename; a local run folder takes the same code path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gem import storage
from gem.faults import ENV_VAR
from gem.precompute.model import ModelPin, PrecomputeModel, PromotedModelMissing, load_plain_weights
from gem.train import checkpoint
from tests.support import make_config, tiny_task, tiny_trainer

REPOSITORY = Path(__file__).resolve().parents[2]

# A tiny run in a fresh process, on the run folder argv[1]: GEM_CRASH_AT kills it inside a save. On one
# thread, as every run in this module: a float sum over another thread count rounds differently.
TRAIN = """
import sys
import torch
from tests.support import tiny_trainer
torch.set_num_threads(1)
tiny_trainer(sys.argv[1]).fit()
"""


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Every run here on one torch thread: the runs compared bit for bit then round alike whatever
    thread count an earlier test in this worker left behind."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An uninterrupted tiny run on a local folder: its losses and final weights."""
    trainer = tiny_trainer(tmp_path_factory.mktemp("full"))
    losses = trainer.fit().losses
    return {"losses": losses, "weights": {k: v.clone() for k, v in trainer.task.state_dict().items()}}


@pytest.fixture(params=["local", "s3"])
def run_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "lake" / "_checkpoints")
    return request.getfixturevalue("s3_bucket") + "/lake/_checkpoints"


def names(uris: list[Any]) -> list[str]:
    return [storage.name(u) for u in uris]


def assert_same_weights(got: torch.nn.Module, want: dict[str, torch.Tensor]) -> None:
    state = got.state_dict()
    for name, tensor in want.items():
        assert torch.equal(tensor, state[name]), name


def test_a_run_on_s3_saves_resumes_exactly_and_warm_starts(s3_bucket: str, tmp_path: Path,
                                                           uninterrupted: dict[str, Any]) -> None:
    run = s3_bucket + "/lake/_checkpoints/kunlun-2026-01-03"
    first = tiny_trainer(run)
    saved = first.fit(steps=6).checkpoint  # "killed" after step 6
    assert saved == f"{run}/step-00000006"
    assert checkpoint.published(run) == [f"{run}/step-00000006", f"{run}/step-00000004"]
    files = names(storage.walk_files(saved))
    assert ".metadata" in files and checkpoint.EXTRA in files and any(f.endswith(".distcp") for f in files)
    assert checkpoint.read_extra(saved)["loader"] == {"position": 6}
    with pytest.raises(checkpoint.CheckpointError, match="already exists"):
        first.save()
    storage.delete(saved, recursive=True)  # resume from 4, as after a crash at step 7
    resumed = tiny_trainer(run)
    assert resumed.resume() and resumed.step == 4
    assert resumed.fit().losses == uninterrupted["losses"]
    assert_same_weights(resumed.task, uninterrupted["weights"])
    # Another day's run warm-starts from the S3 run folder's latest checkpoint: weights only.
    day2 = tiny_trainer(tmp_path / "day2")
    assert day2.warm_start(run) == f"{run}/step-00000010"
    assert_same_weights(day2.task, uninterrupted["weights"])
    assert day2.step == 0 and day2.stream.position == 0


def test_a_writer_killed_inside_a_save_leaves_a_partial_that_is_ignored_and_removed(
        run_root: str, uninterrupted: dict[str, Any]) -> None:
    """Killed (SIGKILL, gem.faults) after its shards of step 8 are written and before extra.json:
    the step folder is never listed or loaded, the resume removes it and continues from step 4, and
    the run still equals an uninterrupted one."""
    run = storage.join(run_root, "run")
    env = {**os.environ, ENV_VAR: "checkpoint:shards_written@2"}
    killed = subprocess.run([sys.executable, "-c", TRAIN, run], env=env, cwd=REPOSITORY, capture_output=True,
                            text=True, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    partial = checkpoint.step_dir(run, 8)
    left = names(storage.walk_files(partial))
    assert any(f.endswith(".distcp") for f in left) and checkpoint.EXTRA not in left
    assert names(checkpoint.published(run)) == ["step-00000004"]
    assert storage.name(checkpoint.latest(run)) == "step-00000004"
    with pytest.raises(checkpoint.CheckpointError, match="partial"):
        checkpoint.load(partial, {})
    resumed = tiny_trainer(run)
    assert resumed.resume() and resumed.step == 4
    assert storage.walk_files(partial) == []  # discarded before the resume
    assert resumed.fit().losses == uninterrupted["losses"]
    assert names(checkpoint.published(run)) == ["step-00000010", "step-00000008", "step-00000004"]
    assert checkpoint.discard_partials(run) == []


def test_a_partial_folder_on_s3_is_ignored_by_latest_and_removed_by_discard_partials(s3_bucket: str) -> None:
    run = s3_bucket + "/ckpt/run"
    tiny_trainer(run).fit(steps=4)
    partial, old_style = checkpoint.step_dir(run, 12), f"{run}/.tmp-step-00000016-deadbeef"
    storage.write(f"{partial}/__0_0.distcp", b"half a shard")
    storage.write(f"{old_style}/extra.json", "{}")  # a renaming writer's temporary folder
    assert checkpoint.latest(run) == f"{run}/step-00000004"
    assert not checkpoint.is_published(partial) and checkpoint.is_published(checkpoint.latest(run))
    assert sorted(checkpoint.discard_partials(run)) == sorted([partial, old_style])
    assert names(storage.listdir(run)) == ["step-00000004"]


def test_a_corrupt_checkpoint_on_s3_is_set_aside_and_its_step_written_afresh(
        s3_bucket: str, uninterrupted: dict[str, Any]) -> None:
    run = s3_bucket + "/ckpt/run"
    tiny_trainer(run).fit(steps=8)  # checkpoints at steps 4 and 8
    shard = next(f for f in storage.walk_files(checkpoint.step_dir(run, 8)) if f.endswith(".distcp"))
    truncated = storage.read_bytes(shard)[:100]
    storage.write(shard, truncated)
    resumed = tiny_trainer(run)
    with pytest.warns(UserWarning, match="(?s)step-00000008 is corrupted or incomplete.*set aside as .corrupt-step-00000008-"):
        assert resumed.resume()
    assert resumed.step == 4
    entries = storage.listdir(run)
    assert names(entries)[0].startswith(".corrupt-step-00000008-") and names(entries)[1:] == ["step-00000004"]
    # Every file is kept for a post-mortem, the truncated shard as it was.
    assert names(storage.walk_files(entries[0])) == sorted([".metadata", storage.name(shard), checkpoint.EXTRA])
    assert storage.read_bytes(storage.join(entries[0], storage.name(shard))) == truncated
    with pytest.raises(checkpoint.CheckpointError, match="set aside"):
        checkpoint.load(entries[0], {})
    assert resumed.fit().losses == uninterrupted["losses"]  # step 8 is written afresh on the way
    assert names(checkpoint.published(run)) == ["step-00000010", "step-00000008", "step-00000004"]


def test_precompute_loads_a_pinned_checkpoint_from_s3(s3_bucket: str, tmp_path: Path) -> None:
    trainer = tiny_trainer(s3_bucket + "/lake/_checkpoints/run")
    path = trainer.fit(steps=4).checkpoint
    plain = tiny_task()
    load_plain_weights(plain, path, "torch")
    assert_same_weights(plain, trainer.task.state_dict())
    gone = ModelPin(f"{s3_bucket}/lake/_checkpoints/gone/step-00000004", "kunlun@gone", "2026-01-03",
                    "2026-01-04", ())
    with pytest.raises(PromotedModelMissing, match="kunlun@gone.*is gone"):
        PrecomputeModel.load(make_config(tmp_path), gone)
