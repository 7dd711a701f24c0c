"""Checkpoints that reshard: a torchrec-sharded trainer's checkpoint saved by 2 gloo ranks resumes in 1
process, and one saved by 1 process resumes on 2 ranks (torch.distributed.checkpoint places each
table, and its rows' fused RowWiseAdagrad state, on whichever rank the new plan gives it).

After the load, the gathered weights equal the saver's bit for bit and the held-out NE of the
loaded model equals the saver's within 1e-6; the loaded trainer, saving again under its own world
size, writes the same tensors it loaded (model, dense AdamW state and the tables' optimizer state),
and trains on. The stream position restarts as its `resharded_state` says, with a warning."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gem.config import TrainConfig
from gem.data.batch import Batch
from gem.train import checkpoint
from gem.train.checkpoint import CheckpointError
from gem.train.evaluate import evaluate
from gem.train.trainer import Trainer
from tests.support import ListStream, checkpoint_tensors, run_two_ranks, tiny_batch, tiny_task

pytest.importorskip("torchrec")

CFG = TrainConfig(steps=8, lr=3e-3, checkpoint_every=4, embedding_optimizer="rowwise_adagrad", embedding_lr=0.1)
SAVED_AT = 4  # the saver trains this many steps and checkpoints
MORE = 2  # steps the loaded trainer trains on
STEP = f"step-{SAVED_AT:08d}"
NE_TOLERANCE = 1e-6


@pytest.fixture(autouse=True)
def no_leftover_group():
    """A failing test must not leave its one-rank group to the next."""
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _trainer(run_dir: Path, rank: int = 0) -> Trainer:
    """The tiny torchrec trainer; each rank reads its own batches."""
    torch.manual_seed(0)
    stream = ListStream()
    stream.items = [tiny_batch(seed=100 * i + rank) for i in range(6)]
    return Trainer(tiny_task("torchrec"), stream, CFG, run_dir)


def _held_out_ne(weights: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per task, the NE of a plain-torch task with `weights` on held-out batches (what the pipeline's
    evaluation runs after training)."""
    plain = tiny_task("torch")
    plain.load_state_dict(weights)
    scores = evaluate(plain, [tiny_batch(b=64, seed=1000 + i) for i in range(4)])
    return {name: s["ne"] for name, s in scores.items()}


def _saved(trainer: Trainer) -> dict[str, Any]:
    """What the saver reports after training: gathered weights and their NE (rank 0; None elsewhere).
    Copies: on the CPU the dense tensors of plain_state are the model's own, which training on changes."""
    plain = trainer.plain_state()
    weights = {k: v.clone() for k, v in plain.items()} if plain is not None else None
    return {"weights": weights, "ne": _held_out_ne(weights) if weights is not None else None}


def _saved_by_one_process(run_dir: Path) -> dict[str, Any]:
    """Train the tiny trainer SAVED_AT steps in this process (checkpointed in run_dir); -> `_saved`."""
    trainer = _trainer(run_dir)
    try:
        trainer.fit(steps=SAVED_AT)
        return _saved(trainer)
    finally:
        trainer.close()


def _loaded(run_dir: Path, resaved: Path, rank: int = 0) -> dict[str, Any]:
    """Resume `run_dir`'s checkpoint under this world size; -> the gathered weights and NE (rank 0),
    the warnings, the tables this rank holds, and the losses of training on. The loaded state is
    also saved again, unchanged, in `resaved`."""
    trainer = _trainer(run_dir, rank)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resumed = trainer.resume()
        report = {"resumed": resumed, "step": trainer.step, **_saved(trainer),
                  "warnings": [str(w.message) for w in caught if issubclass(w.category, UserWarning)],
                  "owned": sorted(k for k, v in trainer.model.state_dict().items()
                                  if hasattr(v, "local_shards") and v.local_shards())}
        trainer.run_dir = resaved
        trainer.save()
        trainer.run_dir = run_dir
        report["losses"] = trainer.fit(steps=SAVED_AT + MORE).losses
        return report
    finally:
        trainer.close()


def _assert_resharded(saver: dict[str, Any], loaded: dict[str, Any], saved_by: int, loaded_by: int,
                      tmp_path: Path) -> None:
    """The loaded run (rank 0's report) holds the saver's state exactly, evaluates as it did and trains on."""
    assert loaded["resumed"] and loaded["step"] == SAVED_AT
    assert any(f"saved by {saved_by} rank(s), this run has {loaded_by}" in w for w in loaded["warnings"])
    # Every weight, gathered under the plain task's names, bit-equal.
    assert set(loaded["weights"]) == set(saver["weights"])
    assert any(k.startswith("embeddings.tables.") for k in saver["weights"])
    for name, tensor in saver["weights"].items():
        assert torch.equal(tensor, loaded["weights"][name]), name
    # The held-out NE of the saver's weights.
    assert set(loaded["ne"]) == set(saver["ne"]) and all(v is not None for v in saver["ne"].values())
    for task, ne in saver["ne"].items():
        assert abs(loaded["ne"][task] - ne) <= NE_TOLERANCE, task
    # Saved again under the loader's world size: the same tensors, the optimizers' included.
    before, again = checkpoint_tensors(tmp_path / "run" / STEP), checkpoint_tensors(tmp_path / "resaved" / STEP)
    assert set(before) == set(again)
    assert any(k.startswith("optimizer.") and k.endswith("exp_avg_sq") for k in before)
    assert any(k.startswith("embedding_optimizer.") and k.endswith("momentum1") for k in before)
    for key, tensor in before.items():
        assert torch.equal(tensor, again[key]), key
    assert len(list((tmp_path / "run" / STEP).glob("*.distcp"))) == saved_by
    assert len(list((tmp_path / "resaved" / STEP).glob("*.distcp"))) == loaded_by
    # It trains on under its own world size and checkpoints there.
    assert len(loaded["losses"]) == SAVED_AT + MORE and all(torch.isfinite(torch.tensor(loaded["losses"])))
    assert (tmp_path / "run" / f"step-{SAVED_AT + MORE:08d}" / "extra.json").is_file()


def _save_on_two_ranks(rank: int, init_file: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        trainer = _trainer(Path(out) / "run", rank)
        trainer.fit(steps=SAVED_AT)
        torch.save(_saved(trainer), Path(out) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


class PositionOnly:
    """A stream that knows its position but not how to place it under another world size."""

    def __init__(self) -> None:
        self.inner = ListStream()

    def batches(self, limit: int | None = None) -> Iterator[Batch]:
        return self.inner.batches(limit)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


def test_a_checkpoint_saved_by_two_ranks_resumes_in_one_process(tmp_path):
    saver, _ = run_two_ranks(_save_on_two_ranks, tmp_path)
    # A stream without resharded_state is refused by name, and the checkpoint stays published.
    torch.manual_seed(0)
    refused = Trainer(tiny_task("torchrec"), PositionOnly(), CFG, tmp_path / "run")
    try:
        with pytest.raises(CheckpointError, match="saved by 2 rank.*PositionOnly cannot place its saved positions"):
            refused.resume()
    finally:
        refused.close()
    assert checkpoint.latest(tmp_path / "run") == tmp_path / "run" / STEP
    loaded = _loaded(tmp_path / "run", tmp_path / "resaved")
    assert len(loaded["owned"]) == 3  # alone, it holds every table
    _assert_resharded(saver, loaded, saved_by=2, loaded_by=1, tmp_path=tmp_path)


def _load_on_two_ranks(rank: int, init_file: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        torch.save(_loaded(Path(out) / "run", Path(out) / "resaved", rank), Path(out) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def test_a_checkpoint_saved_by_one_process_resumes_on_two_ranks(tmp_path):
    saver = _saved_by_one_process(tmp_path / "run")
    r0, r1 = run_two_ranks(_load_on_two_ranks, tmp_path)
    # Table-wise on 2 ranks: each table is now held by one of them.
    assert not set(r0["owned"]) & set(r1["owned"]) and len(r0["owned"]) + len(r1["owned"]) == 3
    assert r1["weights"] is None and r1["resumed"] and r1["step"] == SAVED_AT
    _assert_resharded(saver, r0, saved_by=1, loaded_by=2, tmp_path=tmp_path)


def _plain_copy_on_rank_zero(rank: int, init_file: str, out: str) -> None:
    """Rank 0 loads a checkpoint into a plain-torch task while rank 1 waits at a barrier, as the
    pretraining gate scores the promoted model; a load that ran a collective would hang both."""
    import datetime as dt

    from gem.precompute.model import load_plain_weights

    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                                         timeout=dt.timedelta(seconds=60))
    try:
        weights = None
        if rank == 0:
            plain = tiny_task("torch")
            load_plain_weights(plain, str(Path(out) / "run" / STEP), "torchrec")
            weights = {k: v.clone() for k, v in plain.state_dict().items()}
        torch.distributed.barrier()
        torch.save({"weights": weights}, Path(out) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def test_one_rank_loads_a_plain_copy_while_the_others_wait(tmp_path):
    saver = _saved_by_one_process(tmp_path / "run")
    r0, r1 = run_two_ranks(_plain_copy_on_rank_zero, tmp_path)
    assert r1["weights"] is None
    for key, tensor in saver["weights"].items():
        assert torch.equal(r0["weights"][key], tensor), key
