"""The train task: embeddings + dense body + task heads, and the loss it owns.

    loss = sum_t task_weight_t * [sum_b mask_bt * w_bt * BCE(logit_bt, y_bt)] / [sum_b mask_bt * w_bt]

mask: the example was drawn for task t (the loader's label_mask); w: the loader's importance weight
1 / p, so the loss estimates the unsampled data's loss. Tasks with no drawn example in a batch add 0.

With a history autoencoder (LoopFM, gem.model.history_code_autoencoder) the task also trains it on the
representation, detached: its loss adds only the autoencoder's gradients. The loss returned keeps the
model's value (what the trainer logs); the autoencoder's own loss is `last_reconstruction_loss`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gem.data.batch import Batch


def masked_weighted_bce(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor,
                        task_weights: torch.Tensor) -> torch.Tensor:
    w = weights * mask.to(weights.dtype)  # (B, T)
    per = F.binary_cross_entropy_with_logits(logits.float(), labels, reduction="none") * w  # fp32 under autocast
    denom = w.sum(0)  # (T,)
    per_task = torch.where(denom > 0, per.sum(0) / denom.clamp_min(1e-12), torch.zeros_like(denom))
    return (per_task * task_weights).sum()


class GemTrainTask(nn.Module):
    """Batch -> (loss, logits). `body` maps (sparse emb, dense, sequences) -> (B, body.out_dim)."""

    def __init__(self, embeddings: nn.Module, body: nn.Module, heads: nn.Module, task_weights: torch.Tensor,
                 history_autoencoder: nn.Module | None = None) -> None:
        super().__init__()
        self.embeddings, self.body, self.heads = embeddings, body, heads
        self.register_buffer("task_weights", task_weights.float())
        # None: no submodule, so the state dict is that of a task without one.
        self.history_autoencoder = history_autoencoder
        self.last_reconstruction_loss: torch.Tensor | None = None

    def body_inputs(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        """The body's embedded inputs: ({feature: (B, d)} of the batch's sparse ids, {event: {"id_emb"
        (N_e, d), "surface", "objective" (N_e,), "gap_s" (N_e,), "offsets" (B+1,)}})."""
        sparse, seq_ids = self.embeddings.embed(batch)  # PlainEmbeddings or TorchrecEmbeddings
        sequences = {
            e: {"id_emb": seq_ids[e], "surface": j.values["surface"], "objective": j.values["objective"],
                "gap_s": j.values["gap_s"], "offsets": j.offsets}
            for e, j in batch.sequences.items()
        }
        return sparse, sequences

    def representation(self, batch: Batch) -> torch.Tensor:
        """(B, body.out_dim): what the heads read (and what a student is handed)."""
        sparse, sequences = self.body_inputs(batch)
        return self.body(sparse, batch.dense, sequences)

    def logits(self, batch: Batch) -> torch.Tensor:
        return self.heads(self.representation(batch))

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        representation = self.representation(batch)  # (B, body.out_dim)
        logits = self.heads(representation)
        loss = masked_weighted_bce(logits, batch.labels, batch.label_mask, batch.weights, self.task_weights)
        if self.history_autoencoder is not None:
            reconstruction = self.history_autoencoder.loss(representation.detach())  # no path into the model
            self.last_reconstruction_loss = reconstruction.detach()
            loss = loss + (reconstruction - reconstruction.detach())  # value unchanged, gradient added
        return loss, logits
