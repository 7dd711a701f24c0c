"""torchrec sparse path: the EmbeddingCollection on the batch's KJTs equals the plain tables, and
an explicit TABLE_WISE / FUSED plan shards it over 2 gloo ranks whose tables and dense weights train."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gem.model.build import build_task
from tests.support import TINY_SPARSE, TINY_TASKS, run_two_ranks, tiny_batch, tiny_model_config

pytest.importorskip("torchrec")


def _tasks(arch: str = "kunlun"):
    torch.manual_seed(0)
    plain = build_task(tiny_model_config(arch), TINY_TASKS, TINY_SPARSE, dense_dim=6)
    torch.manual_seed(0)
    rec = build_task(tiny_model_config(arch), TINY_TASKS, TINY_SPARSE, dense_dim=6, sparse_backend="torchrec")
    state = {k: v for k, v in plain.state_dict().items() if not k.startswith("embeddings.")}
    rec.load_state_dict(state, strict=False)
    for name, table in plain.embeddings.tables.items():
        rec.embeddings.collection.embeddings[name].weight.data.copy_(table.weight.data)
    return plain, rec


def test_torchrec_collection_equals_plain_tables():
    plain, rec = _tasks()
    batch = tiny_batch(b=10, seed=4)
    p_sparse, p_seq = plain.embeddings.embed(batch)
    r_sparse, r_seq = rec.embeddings.embed(batch)
    for f in TINY_SPARSE:
        torch.testing.assert_close(r_sparse[f], p_sparse[f])
    for e in batch.sequences:
        torch.testing.assert_close(r_seq[e], p_seq[e])
    torch.testing.assert_close(rec(batch)[1], plain(batch)[1])
    kjt = rec.embeddings.features(batch)
    assert kjt.keys() == [*TINY_SPARSE, "impression_history", "click_history", "conversion_history"]
    assert int(kjt.values().max()) < max(rec.embeddings.rows.values())  # ids bucketed into their tables


def test_plan_is_table_wise_on_the_fused_kernel():
    from gem.train.sharding import sharding_plan

    _, rec = _tasks()
    plan = sharding_plan(rec, world_size=2, device_type="cpu")
    module_plan = next(iter(plan.plan.values()))
    assert set(module_plan) == set(rec.embeddings.collection.embeddings)
    for table, spec in module_plan.items():
        assert spec.sharding_type == "table_wise" and spec.compute_kernel == "fused", table
        assert len(spec.ranks) == 1


def _worker(rank: int, init_file: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        from gem.train.sharding import dense_parameters, shard_task

        _, rec = _tasks()
        before = {n: t.weight.detach().clone() for n, t in rec.embeddings.collection.embeddings.items()}
        model, _ = shard_task(rec, embedding_lr=0.5)
        opt = torch.optim.SGD(dense_parameters(model), lr=0.1)
        losses = []
        for step in range(3):
            opt.zero_grad()
            loss, _ = model(tiny_batch(b=8, seed=10 * step + rank))
            loss.backward()
            opt.step()
            losses.append(float(loss))
        state = model.state_dict()
        owned = {}
        for name, initial in before.items():
            shards = state[f"embeddings.collection.embeddings.{name}.weight"].local_shards()
            if shards:
                owned[name] = bool((shards[0].tensor - initial).abs().sum() > 0)
        dense = {k: v for k, v in state.items() if not k.startswith("embeddings.")}
        torch.save({"owned": owned, "dense": dense, "losses": losses}, Path(out) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_rank_sharded_training_updates_tables_and_agrees_on_dense(tmp_path):
    r0, r1 = run_two_ranks(_worker, tmp_path)
    # Each table lives on exactly one rank, and the fused optimizer moved every table some id hit.
    assert set(r0["owned"]) | set(r1["owned"]) == {"user_id", "ad_id", "surface"}
    assert not set(r0["owned"]) & set(r1["owned"])
    assert all({**r0["owned"], **r1["owned"]}.values())
    for name, tensor in r0["dense"].items():  # DDP kept the dense replicas identical
        torch.testing.assert_close(tensor, r1["dense"][name], msg=name)
