"""A per-surface student: the small serving model distilled from the foundation model (FM).

    ids, counters, short sequences --embeddings--> DLRM body (gem.model.dlrm) --> h (B, D)
    serving logits      = heads(h)                                   true labels only; what serves
    distillation logits = distill_heads(scale_gradient(h, beta))      ExFM auxiliary head (aux_head)
    adapter logits      = StudentAdapter(y_FM)                        ExFM student adapter (adapter)
    LoopFM (history_codes): the user's past FM codes pooled by mean and by target attention
        (gem.model.history_code_feature) enter the DLRM as two more feature embeddings.

Which of these a student has is its variant (StudentConfig.variant, configs.STUDENT_VARIANTS); the
loss is the sum of its terms (gem.model.distillation), `loss_terms` names them. Evaluation and
serving read `logits`: the serving head alone, whose inputs are the example's features and, with
LoopFM, codes logged before it - never the FM's prediction of the example itself.

The body is the project's DLRM, torchrec.models.dlrm's DenseArch -> InteractionArch -> OverArch in
plain torch (tests/unit/test_baselines.py loads the same weights into both and compares): torchrec's
own DLRM class takes one KeyedJaggedTensor of pooled bags and ends in one logit, while a student
reads the Batch's jagged sequences (their most recent max_len events), adds the LoopFM vectors as
features and feeds several heads; and the dense model stays importable without torchrec.
"""

from __future__ import annotations

import torch
from torch import nn

from gem.data.batch import Batch
from gem.model.build import build_embeddings, task_weight_vector
from gem.model.configs import StudentConfig
from gem.model.distillation import StudentAdapter, distillation_losses, fm_signals
from gem.model.dlrm import DLRM
from gem.model.heads import DomainExpertHeads
from gem.model.history_code_feature import HistoryCodeFeature
from gem.model.ops.grad_scale import scale_gradient
from gem.model.task import GemTrainTask, masked_weighted_bce

# The LoopFM vectors' names among the DLRM's feature embeddings.
HISTORY_MEAN, HISTORY_ATTENTION = "history_codes_mean", "history_codes_attention"
TARGET_FEATURE = "ad_id"  # the candidate whose embedding queries the history codes


class StudentTask(GemTrainTask):
    """Batch -> (loss, serving logits (B, T)); a GemTrainTask, so the trainer and evaluator run it as is."""

    def __init__(self, cfg: StudentConfig, embeddings: nn.Module, body: DLRM, heads: DomainExpertHeads,
                 task_weights: torch.Tensor, distill_heads: DomainExpertHeads | None = None,
                 adapter: StudentAdapter | None = None, history_codes: HistoryCodeFeature | None = None) -> None:
        super().__init__(embeddings, body, heads, task_weights)
        self.cfg = cfg
        self.distill_heads, self.adapter, self.history_codes = distill_heads, adapter, history_codes

    def representation(self, batch: Batch) -> torch.Tensor:
        """(B, body.out_dim): the DLRM over the ids, counters, sequences and (LoopFM) history codes."""
        sparse, sequences = self.body_inputs(batch)
        if self.history_codes is not None:
            if batch.fm_history_codes is None:
                raise ValueError("a LoopFM student needs the batch's fm_history_codes (from gold.fm_history_codes)")
            mean, attended = self.history_codes(batch.fm_history_codes, batch.impression_times, sparse[TARGET_FEATURE])
            sparse = {**sparse, HISTORY_MEAN: mean, HISTORY_ATTENTION: attended}
        return self.body(sparse, batch.dense, sequences)

    def loss_terms(self, batch: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """({"serving": ..., and the variant's distillation terms}, serving logits (B, T))."""
        h = self.representation(batch)  # (B, D)
        logits = self.heads(h)
        terms = {"serving": masked_weighted_bce(logits, batch.labels, batch.label_mask, batch.weights,
                                                self.task_weights)}
        if self.distill_heads is not None:
            distill_logits = self.distill_heads(scale_gradient(h, self.cfg.distillation.beta))
            adapter_logits = self.adapter(*fm_signals(batch)) if self.adapter is not None else None
            terms.update(distillation_losses(distill_logits, adapter_logits, batch, self.task_weights,
                                             self.cfg.distillation))
        return terms, logits

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        terms, logits = self.loss_terms(batch)
        return torch.stack(list(terms.values())).sum(), logits

    @torch.no_grad()
    def init_from_base_rates(self, rates: dict[str, float]) -> None:
        """Both heads start at each task's base rate (DomainExpertHeads.init_from_base_rates)."""
        for heads in (self.heads, self.distill_heads):
            if heads is not None:
                heads.init_from_base_rates(rates)


def build_student(cfg: StudentConfig, tasks: tuple[str, ...], sparse_features: tuple[str, ...], dense_dim: int,
                  code_dim: int, task_weights: dict[str, float] | None = None,
                  events: tuple[str, ...] = ("impression", "click", "conversion")) -> StudentTask:
    """The student of cfg.variant for one surface's `tasks`. code_dim: the FM's history code width
    (ModelConfig.history_codes.code_dim), read only by LoopFM variants."""
    surfaces = sorted({t.split("/")[0] for t in tasks})
    if len(surfaces) != 1:
        raise ValueError(f"a student serves one surface; its tasks span {surfaces}")
    missing = sorted(set(sparse_features) - set(cfg.embeddings.buckets))
    if missing:
        raise ValueError(f"student.embeddings.buckets has no table for sparse features {missing}")
    reads_codes = cfg.uses("history_codes")
    if reads_codes and TARGET_FEATURE not in sparse_features:
        raise ValueError(f"LoopFM's target attention reads the {TARGET_FEATURE!r} embedding; it is not a feature")
    body_features = (*sparse_features, HISTORY_MEAN, HISTORY_ATTENTION) if reads_codes else tuple(sparse_features)
    body = DLRM(cfg.dlrm, body_features, dense_dim)

    def heads() -> DomainExpertHeads:
        return DomainExpertHeads(body.out_dim, tasks, cfg.heads.hidden, cfg.heads.shared_experts)

    return StudentTask(
        cfg, build_embeddings(cfg.embeddings, cfg.embeddings.backend, events), body, heads(),
        task_weight_vector(tasks, task_weights),
        distill_heads=heads() if cfg.uses("aux_head") else None,
        adapter=StudentAdapter(len(tasks), cfg.distillation.adapter_hidden) if cfg.uses("adapter") else None,
        history_codes=HistoryCodeFeature(code_dim, cfg.dlrm.dim, cfg.history_codes) if reads_codes else None,
    )
