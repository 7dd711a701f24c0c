"""Training checkpoints: a killed and resumed run equals an uninterrupted one (losses and final
weights, exactly, on CPU); checkpoints are published whole (extra.json written last) and never
overwritten; partial or corrupted ones are refused with a clear error; warm start loads weights
only. The same on an object store: tests/unit/test_checkpoint_storage.py."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest
import torch

from gem.train import checkpoint
from gem.train.trainer import Trainer
from tests.support import TINY_TRAIN, ListStream, tiny_task, tiny_trainer


@pytest.mark.parametrize("cpu_bf16", [False, True], ids=["fp32", "cpu_bf16"])
def test_killed_and_resumed_run_equals_uninterrupted(tmp_path, cpu_bf16):
    """Bit for bit, in fp32 and under CPU bf16 autocast (train.cpu_bf16)."""
    cfg = dataclasses.replace(TINY_TRAIN, cpu_bf16=cpu_bf16)
    full = tiny_trainer(tmp_path / "full", cfg=cfg).fit()
    assert all(math.isfinite(loss) for loss in full.losses)
    first = tiny_trainer(tmp_path / "killed", cfg=cfg)
    assert first.autocast == cpu_bf16
    first.fit(steps=6)  # "killed" after step 6: the last checkpoint is step 4
    assert sorted(p.name for p in (tmp_path / "killed").iterdir()) == ["step-00000004", "step-00000006"]
    # A restart sees the latest checkpoint (6); drop it to resume from 4, as after a crash at step 7.
    shutil.rmtree(tmp_path / "killed" / "step-00000006")
    resumed = tiny_trainer(tmp_path / "killed", cfg=cfg)
    assert resumed.resume() and resumed.step == 4
    result = resumed.fit()
    assert result.losses == full.losses and len(full.losses) == 10
    reference = tiny_trainer(tmp_path / "full2", cfg=cfg)
    reference.fit()
    got = resumed.task.state_dict()
    for name, tensor in reference.task.state_dict().items():
        assert torch.equal(tensor, got[name]), name


def test_checkpoints_are_never_overwritten_and_partials_never_loaded(tmp_path):
    t = tiny_trainer(tmp_path)
    t.fit(steps=4)
    with pytest.raises(checkpoint.CheckpointError, match="already exists"):
        t.save()
    partial = tmp_path / ".tmp-step-00000009-deadbeef"
    partial.mkdir()
    assert checkpoint.latest(tmp_path).name == "step-00000004"
    with pytest.raises(checkpoint.CheckpointError, match="partial"):
        checkpoint.load(partial, {})
    assert checkpoint.discard_partials(tmp_path) == [partial]


def test_corrupted_or_incomplete_checkpoints_are_refused(tmp_path):
    t = tiny_trainer(tmp_path)
    path = t.fit(steps=4).checkpoint
    shard = next(path.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])  # truncated
    with pytest.raises(checkpoint.CheckpointError, match="corrupted or incomplete"):
        checkpoint.load(path, tiny_trainer(tmp_path)._state())
    (path / checkpoint.EXTRA).unlink()
    with pytest.raises(checkpoint.CheckpointError, match="extra.json is missing"):
        checkpoint.load(path, {})


def test_resume_sets_a_corrupt_latest_aside_and_continues_from_the_one_before(tmp_path):
    """A crash mid-write leaves an unpublished folder; a broken latest checkpoint (here: a truncated shard)
    must not fail every retry: resume warns, sets it aside and continues from the step before, and
    the finished run still equals an uninterrupted one."""
    full = tiny_trainer(tmp_path / "full").fit()
    killed = tiny_trainer(tmp_path / "run")
    killed.fit(steps=8)  # checkpoints at steps 4 and 8
    shard = next((tmp_path / "run" / "step-00000008").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    (tmp_path / "run" / ".tmp-step-00000012-deadbeef").mkdir()  # a writer killed mid-save
    resumed = tiny_trainer(tmp_path / "run")
    with pytest.warns(UserWarning, match="(?s)step-00000008 is corrupted or incomplete.*set aside as .corrupt-step-00000008"):
        assert resumed.resume()
    assert resumed.step == 4
    names = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert names[0].startswith(".corrupt-step-00000008-") and names[1:] == ["step-00000004"]
    assert resumed.fit().losses == full.losses  # step 8 is written afresh on the way
    # With no loadable checkpoint at all, a run starts from scratch instead of failing.
    shutil.copytree(tmp_path / "full" / "step-00000004", tmp_path / "lone" / "step-00000004")
    shard = next((tmp_path / "lone" / "step-00000004").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.warns(UserWarning, match="step-00000004 is corrupted or incomplete"):
        assert not tiny_trainer(tmp_path / "lone").resume()
    # A step folder without extra.json (written last) is a crashed writer's: removed, never loaded.
    shutil.copytree(tmp_path / "full" / "step-00000004", tmp_path / "partial" / "step-00000004")
    (tmp_path / "partial" / "step-00000004" / checkpoint.EXTRA).unlink()
    assert checkpoint.latest(tmp_path / "partial") is None
    assert not tiny_trainer(tmp_path / "partial").resume()
    assert list((tmp_path / "partial").iterdir()) == []


def test_warm_start_loads_weights_only(tmp_path):
    day1 = tiny_trainer(tmp_path / "day1")
    day1.fit(steps=4)
    day2 = tiny_trainer(tmp_path / "day2")
    day2.warm_start(tmp_path / "day1")
    for name, tensor in day1.task.state_dict().items():
        assert torch.equal(tensor, day2.task.state_dict()[name])
    assert day2.step == 0 and day2.stream.position == 0
    extra = json.loads((tmp_path / "day1" / "step-00000004" / checkpoint.EXTRA).read_text())
    assert extra["config"]["train"]["steps"] == 10 and extra["loader"] == {"position": 4}


def test_warm_start_refuses_a_checkpoint_of_another_model_config(tmp_path):
    day1 = Trainer(tiny_task(), ListStream(), TINY_TRAIN, tmp_path / "day1", config_snapshot={"model": {"arch": "kunlun"}})
    day1.fit(steps=2)
    other = Trainer(tiny_task(), ListStream(), TINY_TRAIN, tmp_path / "day2", config_snapshot={"model": {"arch": "hstu"}})
    with pytest.raises(checkpoint.CheckpointError, match="trained with model config"):
        other.warm_start(tmp_path / "day1")


def test_the_sequence_layout_does_not_refuse_a_warm_start(tmp_path):
    """sequence_layout and length_groups choose how the same function is computed: a checkpoint
    trained padded warm-starts a jagged run (and the weights arrive), any other change is refused."""
    def snapshot(**kunlun):
        return {"model": {"arch": "kunlun", "kunlun": {"dim": 16, **kunlun}}}

    padded = Trainer(tiny_task(length_groups=2), ListStream(), TINY_TRAIN, tmp_path / "padded",
                     config_snapshot=snapshot(sequence_layout="padded", length_groups=2))
    padded.fit(steps=2)
    jagged = Trainer(tiny_task(), ListStream(), TINY_TRAIN, tmp_path / "jagged", config_snapshot=snapshot())
    jagged.warm_start(tmp_path / "padded")
    for (name, a), b in zip(padded.model.state_dict().items(), jagged.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    wider = Trainer(tiny_task(), ListStream(), TINY_TRAIN, tmp_path / "wider", config_snapshot=snapshot(dim=32))
    with pytest.raises(checkpoint.CheckpointError, match="trained with model config"):
        wider.warm_start(tmp_path / "padded")


def test_padding_ratio_of_the_batches_is_reported(tmp_path):
    """The padded layout reports the padding of its blocks (less in length groups than in one block
    per batch); the jagged layout the share of its sequence FLOPs spent on padding, which only its
    per-example products have (gem.model.flops.jagged_padding_flops)."""
    from gem.model.flops import jagged_padding_flops

    batches = list(ListStream().batches(limit=3))
    trainer = tiny_trainer(tmp_path / "run", length_groups=3)
    result = trainer.fit(steps=3)
    assert trainer.padding_measure == "padded sequence blocks"
    for event in batches[0].sequences:
        real = sum(int(b.sequences[event].lengths.sum()) for b in batches)
        one_block = sum(b.size * max(1, int(b.sequences[event].lengths.max())) for b in batches)
        grouped = sum(b.padded_sizes(3)[event][1] for b in batches)
        assert result.padding_ratio[event] == pytest.approx(1 - real / grouped)
        assert grouped <= one_block  # the body's length groups pad less than one (B, max length) block
    jagged = tiny_trainer(tmp_path / "jagged")
    result = jagged.fit(steps=3)
    assert jagged.padding_measure == "sequence FLOPs"
    cfg = jagged.model.body.cfg
    for event in batches[0].sequences:
        pairs = [jagged_padding_flops(cfg, {e: j.lengths.tolist() for e, j in b.sequences.items()})[event]
                 for b in batches]
        real, run = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        assert result.padding_ratio[event] == pytest.approx(1 - real / run)
        assert run >= real > 0
        blocks = 1 - sum(int(b.sequences[event].lengths.sum()) for b in batches) / sum(
            b.padded_sizes()[event][1] for b in batches)
        assert result.padding_ratio[event] < blocks  # far less than a padded layout's share


def test_non_finite_gradients_of_a_finite_loss_stop_training_before_the_dense_step(tmp_path):
    """An overflow inside the model can give a finite loss NaN gradients: the run stops before the
    optimizer applies them and writes no checkpoint after them."""
    from gem.train.trainer import NonFiniteLossError

    t = tiny_trainer(tmp_path)
    weight = next(p for p in t.optimizer.param_groups[0]["params"] if p.dim() == 2)
    backward_passes = []

    def poison_step_6(grad: torch.Tensor) -> torch.Tensor:
        backward_passes.append(None)
        return grad * float("nan") if len(backward_passes) == 6 else grad

    weight.register_hook(poison_step_6)
    with pytest.raises(NonFiniteLossError, match=r"step 6: the loss is finite .* gradients are not.*step-00000004"):
        t.fit()
    assert [p.name for p in checkpoint.published(tmp_path)] == ["step-00000004"]
    assert t.step == 5 and torch.isfinite(weight).all()  # the NaN gradient was never applied


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_loss_stops_training_and_keeps_the_last_good_checkpoint(tmp_path, bad):
    from gem.train.trainer import NonFiniteLossError

    t = tiny_trainer(tmp_path)
    t.stream.items[5].dense[0, 0] = bad  # step 6's batch (checkpoints every 4 steps)
    with pytest.raises(NonFiniteLossError, match=r"step 6: the loss is (nan|inf).*last good checkpoint .*step-00000004"):
        t.fit()
    assert [p.name for p in checkpoint.published(tmp_path)] == ["step-00000004"]
    assert t.step == 5 and len(t.losses) == 5  # the bad step neither updated the weights nor counted
    assert all(torch.isfinite(v).all() for v in t.task.state_dict().values())
    resumed = tiny_trainer(tmp_path)
    assert resumed.resume() and resumed.step == 4


def test_a_trainer_without_a_run_folder_trains_the_same_steps_and_writes_nothing(tmp_path, monkeypatch):
    """run_dir None (the quality study's runs): the same losses and weights as a checkpointing run,
    no checkpoint written or resumed, on the device named (here the CPU)."""
    from gem.train.trainer import NonFiniteLossError

    monkeypatch.chdir(tmp_path)
    reference = tiny_trainer(tmp_path / "run").fit()
    torch.manual_seed(0)
    t = Trainer(tiny_task(), ListStream(), TINY_TRAIN, None, device=torch.device("cpu"))
    assert t.device == torch.device("cpu") and not t.resume()
    result = t.fit()
    assert result.losses == reference.losses and result.checkpoint is None and result.steps == TINY_TRAIN.steps
    assert list(tmp_path.iterdir()) == [tmp_path / "run"]
    with pytest.raises(ValueError, match="no run folder"):
        t.save()
    torch.manual_seed(0)
    bad = Trainer(tiny_task(), ListStream(), TINY_TRAIN, None)
    bad.stream.items[2].dense[0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match="step 3: the loss is nan.*writes no checkpoints"):
        bad.fit()
