"""Training with the torchrec sparse backend: tables sharded by the explicit plan and trained by the
fused RowWiseAdagrad, the dense part by AdamW. A killed and resumed run equals an uninterrupted one
exactly on CPU (losses and final weights, tables included), in one process and over 2 gloo ranks;
the gathered weights load into a plain-torch task that gives the same outputs. Alone, a run's saves,
loads and gather take no collective."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from gem.config import TrainConfig
from gem.train.trainer import Trainer
from tests.support import ListStream, run_two_ranks, tiny_batch, tiny_task

pytest.importorskip("torchrec")

CFG = TrainConfig(steps=8, lr=3e-3, checkpoint_every=3, embedding_optimizer="rowwise_adagrad", embedding_lr=0.1)


@pytest.fixture(autouse=True)
def no_leftover_group():
    """A failing test must not leave its one-rank group to the next (plain trainers would wrap in DDP)."""
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _run(run_dir: Path, steps: int | None = None, resume: bool = False) -> tuple[Trainer, list[float], dict]:
    """Train (or resume and train) one torchrec trainer; -> (trainer, losses, plain-torch weights)."""
    torch.manual_seed(0)
    trainer = Trainer(tiny_task("torchrec"), ListStream(), CFG, run_dir)
    try:
        if resume:
            assert trainer.resume()
        result = trainer.fit(steps=steps)
        return trainer, result.losses, trainer.plain_state()
    finally:
        trainer.close()


def test_sharded_trainer_killed_and_resumed_equals_uninterrupted(tmp_path):
    trainer, full_losses, full_weights = _run(tmp_path / "full")
    assert trainer.sharded and not torch.distributed.is_initialized()  # its own one-rank group, closed
    assert len(full_losses) == 8 and full_losses[-1] < full_losses[0]
    _run(tmp_path / "killed", steps=5)  # checkpoints at 3 and 5; drop 5 as if it crashed at step 4
    shutil.rmtree(tmp_path / "killed" / "step-00000005")
    _, losses, weights = _run(tmp_path / "killed", resume=True)
    assert losses == full_losses
    assert set(weights) == set(full_weights)
    for name, tensor in full_weights.items():
        assert torch.equal(tensor, weights[name]), name
    # Resuming without the tables' optimizer state (RowWiseAdagrad's per-row sums) would not match.
    assert any(k.endswith("momentum1") for k in _fused_state_keys(tmp_path / "full" / "step-00000008"))


def _fused_state_keys(path: Path) -> list[str]:
    from torch.distributed.checkpoint import FileSystemReader

    return [k for k in FileSystemReader(str(path)).read_metadata().state_dict_metadata
            if k.startswith("embedding_optimizer.")]


def test_gathered_weights_give_a_plain_torch_task_the_same_outputs(tmp_path):
    torch.manual_seed(0)
    trainer = Trainer(tiny_task("torchrec"), ListStream(), CFG, tmp_path / "run")
    try:
        trainer.fit(steps=2)
        batch = tiny_batch(b=12, seed=77)
        trainer.model.eval()
        with torch.no_grad():
            sharded = trainer.model(batch)[1]
        state = trainer.plain_state()
    finally:
        trainer.close()
    plain = tiny_task("torch")
    plain.load_state_dict(state)
    plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(batch)[1], sharded)


def _worker(rank: int, init_file: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        results = {}
        for name, steps, resume in (("full", None, False), ("killed", 5, False), ("killed", None, True)):
            if resume and rank == 0:
                shutil.rmtree(Path(out) / "killed" / "step-00000005")
            torch.distributed.barrier()
            torch.manual_seed(0)
            stream = ListStream()
            stream.items = [tiny_batch(seed=100 * i + rank) for i in range(6)]  # each rank its own data
            trainer = Trainer(tiny_task("torchrec"), stream, CFG, Path(out) / name)
            if resume:
                assert trainer.resume() and trainer.step == 3
            losses = trainer.fit(steps=steps).losses
            owned = sorted(k for k, v in trainer.model.state_dict().items()
                           if hasattr(v, "local_shards") and v.local_shards())
            results[(name, resume)] = {"losses": losses, "weights": trainer.plain_state(), "owned": owned}
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_rank_sharded_training_resumes_exactly(tmp_path):
    r0, r1 = run_two_ranks(_worker, tmp_path)
    full, resumed = r0[("full", False)], r0[("killed", True)]
    # Table-wise: each table is held by one rank, every table by some rank.
    assert not set(full["owned"]) & set(r1[("full", False)]["owned"])
    assert len(full["owned"]) + len(r1[("full", False)]["owned"]) == 3
    assert resumed["losses"] == full["losses"] and r1[("killed", True)]["losses"] == r1[("full", False)]["losses"]
    assert r1[("full", False)]["weights"] is None  # gathered on rank 0 only
    for name, tensor in full["weights"].items():
        assert torch.equal(tensor, resumed["weights"][name]), name
    # The checkpoint holds both ranks' shards.
    assert len(list((tmp_path / "full" / "step-00000008").glob("*.distcp"))) == 2


def test_a_batch_without_any_history_of_one_event_type_still_trains(tmp_path):
    """Real batches can hold no conversion history at all: the parts of the model that read it get
    no gradient that step, which a static-graph DDP inside DMP rejects (seen on the demo's data)."""
    from dataclasses import replace

    from gem.data.batch import Jagged

    def without_conversions(seed: int):
        batch = tiny_batch(seed=seed)
        empty = Jagged({k: v[:0] for k, v in batch.sequences["conversion"].values.items()},
                       torch.zeros(batch.size + 1, dtype=torch.long))
        return replace(batch, sequences={**batch.sequences, "conversion": empty})

    stream = ListStream()
    stream.items = [tiny_batch(seed=1), without_conversions(2), tiny_batch(seed=3), without_conversions(4)]
    torch.manual_seed(0)
    trainer = Trainer(tiny_task("torchrec"), stream, CFG, tmp_path / "run")
    try:
        losses = trainer.fit(steps=4).losses
    finally:
        trainer.close()
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))


# What a checkpoint's save or load and the tables' gather would call in a process group.
GATHERS = ("gather", "gather_object", "all_gather", "all_gather_object", "scatter_object_list", "broadcast",
           "broadcast_object_list", "barrier")


def _recorded(name: str, called: list[str]):
    """torch.distributed's `name`, noting each call in `called`."""
    call = getattr(torch.distributed, name)

    def recorded(*args, **kwargs):
        called.append(name)
        return call(*args, **kwargs)
    return recorded


def test_a_one_process_run_saves_loads_and_gathers_its_tables_without_collectives(tmp_path, monkeypatch):
    """Alone, the trainer's one-rank gloo group runs collectives in gloo's threads, where a parallel
    torch op starts a second OpenMP team that slows every later step (gem.train.checkpoint.single_process):
    its saves, its resume and its plain state take none."""
    called: list[str] = []
    for name in GATHERS:
        monkeypatch.setattr(torch.distributed, name, _recorded(name, called))
    _, _, weights = _run(tmp_path / "run", steps=5)  # saves at steps 3 and 5, then gathers the tables
    _, _, resumed = _run(tmp_path / "run", steps=6, resume=True)  # loads step 5
    assert called == []
    assert set(weights) == set(resumed) and any("embeddings" in k for k in weights)
