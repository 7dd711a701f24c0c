"""The train task on a loader-shaped batch: logits per task, the masked importance-weighted loss,
and a few optimizer steps that lower it."""

from __future__ import annotations

import torch

from gem.data.batch import Batch, Jagged, Sparse
from gem.model.embeddings import EmbeddingConfig, PlainEmbeddings
from gem.model.heads import DomainExpertHeads
from gem.model.kunlun import Kunlun, KunlunConfig
from gem.model.task import GemTrainTask, masked_weighted_bce

TASKS = ("reels/click", "reels/lead", "fb_feed/click", "fb_feed/lead")
SPARSE = ("user_id", "ad_id", "surface")


def _batch(b: int = 16, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    sequences = {}
    for e, n_max in (("impression", 9), ("click", 4), ("conversion", 2)):
        lengths = torch.randint(0, n_max + 1, (b,), generator=g)
        n = int(lengths.sum())
        sequences[e] = Jagged({"ad_id": torch.randint(0, 1 << 40, (n,), generator=g),
                               "surface": torch.randint(0, 7, (n,), generator=g),
                               "objective": torch.randint(0, 6, (n,), generator=g),
                               "gap_s": torch.rand(n, generator=g) * 1e5},
                              torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]))
    surface_is_reels = torch.rand(b, generator=g) < 0.5
    mask = torch.stack([surface_is_reels, surface_is_reels, ~surface_is_reels, ~surface_is_reels], 1)
    return Batch(
        dense=torch.randn(b, 6, generator=g),
        sparse={f: Sparse(torch.randint(0, 1 << 40, (b,), generator=g), torch.ones(b, dtype=torch.int32))
                for f in SPARSE},
        sequences=sequences,
        labels=(torch.rand(b, 4, generator=g) < 0.3).float() * mask,
        label_mask=mask, weights=mask.float() * (1 + torch.rand(b, 4, generator=g)), tasks=TASKS,
        impression_times=torch.zeros(b, dtype=torch.long),
    )


def _task(backend: str = "torch") -> GemTrainTask:
    """A small Kunlun task; backend "torchrec" puts the same tables in a torchrec EmbeddingCollection."""
    torch.manual_seed(0)
    emb_cfg = EmbeddingConfig(dim=16, buckets={"user_id": 100, "ad_id": 50, "surface": 8}, backend=backend)
    cfg = KunlunConfig(dim=16, mlp_hidden=32)
    body = Kunlun(cfg, SPARSE, dense_dim=6)
    if backend == "torchrec":
        from gem.model.sparse import TorchrecEmbeddings

        embeddings: torch.nn.Module = TorchrecEmbeddings(emb_cfg, ("impression", "click", "conversion"))
    else:
        embeddings = PlainEmbeddings(emb_cfg)
    return GemTrainTask(embeddings, body, DomainExpertHeads(body.out_dim, TASKS, 32, 2), torch.ones(4))


def test_loss_is_masked_and_weighted():
    logits = torch.tensor([[0.0, 5.0], [2.0, -1.0]])
    labels = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    mask = torch.tensor([[True, False], [True, True]])
    weights = torch.tensor([[1.0, 9.0], [3.0, 2.0]])
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    t0 = (1 * bce(torch.tensor(0.0), torch.tensor(1.0)) + 3 * bce(torch.tensor(2.0), torch.tensor(0.0))) / 4
    t1 = bce(torch.tensor(-1.0), torch.tensor(1.0))  # the masked 5.0 logit (weight 9) is ignored
    got = masked_weighted_bce(logits, labels, mask, weights, torch.tensor([1.0, 0.5]))
    assert torch.allclose(got, t0 + 0.5 * t1)


def test_task_trains_on_a_loader_batch():
    task, batch = _task(), _batch()
    loss, logits = task(batch)
    assert logits.shape == (16, 4) and torch.isfinite(loss)
    opt = torch.optim.Adam(task.parameters(), lr=3e-3)
    first = float(loss.detach())
    for _ in range(30):
        opt.zero_grad()
        loss, _ = task(batch)
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.5 * first


def test_heads_start_at_the_base_rate():
    task = _task()
    task.heads.init_from_base_rates({"reels/click": 0.02, "fb_feed/lead": 0.001})
    with torch.no_grad():
        task.heads.towers.zero_()  # only the bias remains
        p = torch.sigmoid(task.logits(_batch()))
    assert torch.allclose(p[:, 0], torch.full_like(p[:, 0], 0.02)) and torch.allclose(p[:, 3], torch.full_like(p[:, 3], 0.001))
    assert torch.allclose(p[:, 1], torch.full_like(p[:, 1], 0.5))  # no rate given: unchanged
