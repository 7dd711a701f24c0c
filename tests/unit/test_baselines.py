"""The baseline architectures in the shared harness: every arch builds from its config, maps a
loader-shaped batch to one logit per task, passes gradients to every parameter, fits a batch; DLRM
matches torchrec.models.dlrm given the same weights; the small ops they add match references."""

from __future__ import annotations

import pytest
import torch

from gem.model.build import build_task
from gem.model.configs import (
    ARCHITECTURES,
    DLRMConfig,
    EmbeddingConfig,
    InterFormerConfig,
    ModelConfig,
    WukongConfig,
)
from gem.model.ops.jagged import jagged_mean, recent_mean
from gem.model.ops.rope import rope
from tests.support import TINY_SPARSE, TINY_TASKS, tiny_batch, tiny_model_config

DIM = 16


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_each_architecture_gives_task_logits_and_gradients_everywhere(arch):
    torch.manual_seed(0)
    task = build_task(tiny_model_config(arch), TINY_TASKS, TINY_SPARSE, dense_dim=6)
    batch = tiny_batch(b=12)
    loss, logits = task(batch)
    assert logits.shape == (12, len(TINY_TASKS)) and torch.isfinite(logits).all()
    loss.backward()
    # The heads' towers start at zero (every task at its base rate): the first gradient reaches the
    # towers and biases only; after one step it reaches every tensor. (LoopFM's autoencoder learns from
    # its own reconstruction loss from the first step, beside the model.)
    moved = {n for n, p in task.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0
             and not n.startswith("history_autoencoder.")}
    assert moved == {"heads.towers", "heads.bias"}, moved
    torch.optim.SGD(task.parameters(), lr=0.1).step()
    task.zero_grad()
    task(batch)[0].backward()
    for name, p in task.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    no_signal = [n for n, p in task.named_parameters() if not p.grad.abs().sum() > 0]
    # Rows of embedding tables no id of the batch hits get zero gradient; every other tensor must move.
    assert all(".tables." in n or "embedding" in n.lower() or n.endswith((".surface.weight", ".objective.weight",
               ".time.weight")) for n in no_signal), no_signal


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_each_architecture_fits_a_batch(arch):
    torch.manual_seed(0)
    task = build_task(tiny_model_config(arch), TINY_TASKS, TINY_SPARSE, dense_dim=6)
    batch = tiny_batch(b=32, seed=1)
    opt = torch.optim.Adam(task.parameters(), lr=3e-3)
    first = float(task(batch)[0].detach())
    for _ in range(60):
        opt.zero_grad()
        loss, _ = task(batch)
        loss.backward()
        opt.step()
    assert float(loss) < 0.6 * first, (arch, first, float(loss))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_an_example_does_not_see_its_batch_neighbours(arch):
    """Padding and batching leak nothing: an example's logits are the same alone and in a batch of
    longer sequences (eval mode, so nothing depends on batch statistics)."""
    torch.manual_seed(0)
    task = build_task(tiny_model_config(arch), TINY_TASKS, TINY_SPARSE, dense_dim=6).eval()
    batch = tiny_batch(b=8, seed=2)
    with torch.no_grad():
        together = task.logits(batch)
        alone = torch.cat([task.logits(_one(batch, i)) for i in range(8)])
    torch.testing.assert_close(alone, together, rtol=1e-4, atol=1e-5)


def _one(batch, i: int):
    """Example i of the batch as a batch of one."""
    from dataclasses import replace

    from gem.data.batch import Jagged, Sparse

    def seq(j: Jagged) -> Jagged:
        lo, hi = int(j.offsets[i]), int(j.offsets[i + 1])
        return Jagged({k: v[lo:hi] for k, v in j.values.items()}, torch.tensor([0, hi - lo]))

    return replace(batch, dense=batch.dense[i:i + 1], labels=batch.labels[i:i + 1],
                   label_mask=batch.label_mask[i:i + 1], weights=batch.weights[i:i + 1],
                   impression_times=batch.impression_times[i:i + 1],
                   sparse={f: Sparse(s.values[i:i + 1], s.lengths[i:i + 1]) for f, s in batch.sparse.items()},
                   sequences={e: seq(j) for e, j in batch.sequences.items()})


def test_config_of_each_arch_validates():
    with pytest.raises(ValueError, match="dense_arch must end in dim"):
        DLRMConfig(dim=16, dense_arch=(32, 8))
    with pytest.raises(ValueError, match="even width"):
        InterFormerConfig(dim=18, heads=2)
    with pytest.raises(ValueError, match="must equal wukong.dim"):
        ModelConfig(arch="wukong", wukong=WukongConfig(dim=8), embeddings=EmbeddingConfig(dim=16))
    with pytest.raises(ValueError, match=r"arch\n  Input should be .kunlun., .hstu."):
        ModelConfig(arch="transformer")


def test_dlrm_matches_torchrec_dlrm_arches():
    """Our plain-torch DLRM computes what torchrec.models.dlrm's DenseArch -> InteractionArch ->
    OverArch compute, once the same weights are loaded."""
    dlrm_mod = pytest.importorskip("torchrec.models.dlrm")
    from gem.model.dlrm import DLRM

    torch.manual_seed(0)
    cfg = DLRMConfig(dim=8, dense_arch=(16, 8), over_arch=(24, 12), max_len={"impression": 5, "click": 3})
    ours = DLRM(cfg, ("user_id", "ad_id"), dense_dim=6)
    dense_arch = dlrm_mod.DenseArch(in_features=6, layer_sizes=list(cfg.dense_arch))
    n = 2 + len(cfg.max_len)
    interaction = dlrm_mod.InteractionArch(num_sparse_features=n)
    over_arch = dlrm_mod.OverArch(in_features=8 + n * (n + 1) // 2, layer_sizes=list(cfg.over_arch))
    ours_linear = [m for m in ours.modules() if isinstance(m, torch.nn.Linear)]
    theirs_linear = [m for a in (dense_arch, over_arch) for m in a.modules() if isinstance(m, torch.nn.Linear)]
    assert len(ours_linear) == len(theirs_linear)
    for a, b in zip(ours_linear, theirs_linear, strict=True):
        b.weight.data.copy_(a.weight.data)
        b.bias.data.copy_(a.bias.data)

    batch = tiny_batch(b=5, seed=3)
    sparse = {"user_id": torch.randn(5, 8), "ad_id": torch.randn(5, 8)}
    seqs = {e: {"id_emb": torch.randn(int(batch.sequences[e].offsets[-1]), 8), "offsets": batch.sequences[e].offsets}
            for e in cfg.max_len}
    bags = torch.stack([recent_mean(seqs[e]["id_emb"], seqs[e]["offsets"], m) for e, m in cfg.max_len.items()], 1)
    embedded = torch.cat([torch.stack([sparse["user_id"], sparse["ad_id"]], 1), bags], 1)
    dense = torch.randn(5, 6)
    expected = over_arch(interaction(dense_arch(dense), embedded))
    torch.testing.assert_close(ours(sparse, dense, seqs), expected)


def test_jagged_mean_and_recent_mean_match_a_loop():
    values = torch.arange(12, dtype=torch.float32).view(6, 2)
    offsets = torch.tensor([0, 2, 2, 6])
    assert jagged_mean(values, offsets).tolist() == [[1.0, 2.0], [0.0, 0.0], [7.0, 8.0]]
    # last 2 of the third example: rows 4, 5
    assert recent_mean(values, offsets, 2).tolist() == [[1.0, 2.0], [0.0, 0.0], [9.0, 10.0]]


def test_rope_scores_depend_on_relative_position_only():
    torch.manual_seed(0)
    q, k = torch.randn(8), torch.randn(8)
    qs, ks = rope(q.expand(6, 8)), rope(k.expand(6, 8))  # the same vectors at positions 0..5
    scores = qs @ ks.T  # (6, 6)
    for delta in range(-3, 4):
        diag = torch.diagonal(scores, offset=delta)
        torch.testing.assert_close(diag, diag[:1].expand_as(diag))
    assert not torch.allclose(torch.diagonal(scores, 0)[:1], torch.diagonal(scores, 2)[:1])
    with pytest.raises(ValueError, match="even head width"):
        rope(torch.randn(3, 5))
