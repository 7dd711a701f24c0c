"""Kunlun (arXiv 2602.10016): two token streams, non-sequence X and per-event-type sequences S.

Per layer l (Kunlun, arXiv 2602.10016):
    X_sum = Gate(LCE(X))                  compress n_x tokens to n_sum; gate Z * sigmoid(MLP(Z))
    H_e   = HSP_e(S_e)                    on GDPA layers (even l); odd layers reuse the cached H_e (CompSkip)
    X     = X + Proj(MoWE([X_sum || H]))  global interaction, back to n_x tokens
    S_e   = S_e + GDPA(Q=S_e, K,V = X_sum)      even l: personalized FFN as attention
    S_e   = S_e + SlidingWindowGDPA(S_e)        odd l: causal self-attention within window_e
    head input = [Gate(LCE(X)) || HSP_e(S_e)] of the final streams (a readout pooling, so the last
                 layer's sequence updates reach the heads too)

Event-level personalization: each event type has its own width, heads (each with its own
activation), HSP seeds and summary tokens, depth (layers it takes part in) and window.
Sequence tokens = id embedding + surface + objective + log time-gap bucket embeddings. Everything
here is plain torch; sparse id embeddings arrive already looked up (gem.model.embeddings), so this
module runs without torchrec.

Ablations (KunlunConfig's switches, defaults = the full model above): `attention="softmax"` swaps
every GDPA (personalized, sliding-window, HSP's seeds) for softmax attention with the same masks;
`pooling="mean"` swaps HSP for a masked mean projected to the same T_e tokens; `compskip=False`
pools afresh on every layer; `sliding_window=False` makes the odd layers full causal attention;
`event_personalization=False` gives every type one shared set of settings (cfg.effective_events).
gem.model.flops.kunlun_flops counts each variant.

Shapes: X (B, n_x, d); S_e (B, L_e, w_e) padded with lengths (B,); H_e (B, T_e, d).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from gem.model.configs import EventConfig, KunlunConfig
from gem.model.ops.gdpa import gdpa, uses_band, windowed_gdpa
from gem.model.ops.jagged import keep_last, to_padded
from gem.model.ops.length_groups import length_groups
from gem.model.ops.masks import padding_mask, sliding_window_mask
from gem.model.ops.softmax_attention import softmax_attention, windowed_softmax_attention
from gem.model.ops.sum_kron import SumKronLinear
from gem.model.ops.time_encoding import time_gap_buckets
from gem.model.wukong import MixtureOfWukongExperts


def attend(attention: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, activations: Sequence[str],
           alpha: float, scale: float, mask: torch.Tensor) -> torch.Tensor:
    """GDPA (`act_h(QK^T * alpha) * scale @ V`) or softmax attention (alpha only) under one mask.
    q (B, H, Lq, Dh), k and v (B, H, Lk, Dh), mask broadcastable to (B, H, Lq, Lk) -> (B, H, Lq, Dh)."""
    if attention == "softmax":
        return softmax_attention(q, k, v, alpha, mask)
    return gdpa(q, k, v, activations, alpha, scale, mask)


class GatedCompression(nn.Module):
    """X (B, n, d) -> Z * sigmoid(MLP(Z)), Z = LCE(X) (B, m, d): tokens mixed linearly (LCE), then gated."""

    def __init__(self, tokens: int, out_tokens: int, dim: int) -> None:
        super().__init__()
        self.lce = nn.Linear(tokens, out_tokens)
        self.gate = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.lce(x.transpose(1, 2)).transpose(1, 2)  # (B, m, d)
        return z * torch.sigmoid(self.gate(z))


class HSP(nn.Module):
    """Hierarchical seed pooling: learnable seeds attend to the sequence (GDPA, or softmax attention
    under attention="softmax"; padding masked), then SumKronLinear compresses the seeds to T tokens
    of width d. forward: S (B, L, w), lengths (B,) -> (B, T, d)."""

    def __init__(self, cfg: EventConfig, dim: int, attention: str = "gdpa") -> None:
        super().__init__()
        self.cfg, self.attention, heads = cfg, attention, len(cfg.activations)
        self.seeds = nn.Parameter(torch.randn(cfg.seeds, cfg.width) * 0.02)
        self.kv = nn.Linear(cfg.width, 2 * cfg.width)
        self.compress = SumKronLinear(cfg.seeds, cfg.summary_tokens, cfg.width, dim, cfg.kron_rank)
        self.heads, self.head_dim = heads, cfg.width // heads

    def forward(self, s: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        b, length, _ = s.shape
        k, v = self.kv(s).view(b, length, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (B, H, L, Dh) x2
        q = self.seeds.view(1, -1, self.heads, self.head_dim).transpose(1, 2).expand(b, -1, -1, -1)
        mask = padding_mask(lengths, length)[:, None, None, :]  # (B, 1, 1, L)
        pooled = attend(self.attention, q, k, v, self.cfg.activations, self.head_dim ** -0.5,
                        1.0 / self.cfg.max_len, mask)
        pooled = pooled.transpose(1, 2).reshape(b, self.cfg.seeds, self.cfg.width)  # (B, seeds, w)
        return self.compress(pooled)  # (B, T, d)


class MeanPool(nn.Module):
    """The pooling="mean" ablation of HSP: each sequence's mean over its real positions, projected
    to T tokens of width d (as many as HSP gives, so the interaction arch's token count is unchanged).
    forward: S (B, L, w), lengths (B,) -> (B, T, d); an empty sequence pools to the projection's bias."""

    def __init__(self, cfg: EventConfig, dim: int) -> None:
        super().__init__()
        self.tokens, self.dim = cfg.summary_tokens, dim
        self.proj = nn.Linear(cfg.width, cfg.summary_tokens * dim)

    def forward(self, s: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        real = padding_mask(lengths, s.shape[1])[:, :, None].to(s.dtype)  # (B, L, 1)
        mean = (s * real).sum(dim=1) / lengths.clamp(min=1)[:, None].to(s.dtype)  # (B, w)
        return self.proj(mean).view(s.shape[0], self.tokens, self.dim)


def pooler(cfg: KunlunConfig, event: EventConfig) -> nn.Module:
    """The module that pools one event type's sequence to its T_e tokens: HSP or MeanPool (cfg.pooling)."""
    return HSP(event, cfg.dim, cfg.attention) if cfg.pooling == "hsp" else MeanPool(event, cfg.dim)


class SequenceLayer(nn.Module):
    """One layer of one event type's stream: attention from X_sum (personalized, even layers) or
    causal self-attention within `window` (odd layers; None = the whole prefix), then an FFN.
    forward: S (B, L, w), lengths (B,), X_sum (B, n_sum, d) -> S (B, L, w), exactly 0 at padding."""

    def __init__(self, cfg: EventConfig, dim: int, personalized: bool, attention: str = "gdpa",
                 window: int | None = None) -> None:
        super().__init__()
        self.cfg, self.personalized, self.attention = cfg, personalized, attention
        self.window = window  # odd layers only; None = the whole causal prefix
        self.heads, self.head_dim = len(cfg.activations), cfg.width // len(cfg.activations)
        self.norm = nn.LayerNorm(cfg.width)
        self.q = nn.Linear(cfg.width, cfg.width)
        self.kv = nn.Linear(dim if personalized else cfg.width, 2 * cfg.width)
        self.out = nn.Linear(cfg.width, cfg.width)
        self.ffn = nn.Sequential(nn.LayerNorm(cfg.width), nn.Linear(cfg.width, 2 * cfg.width), nn.GELU(),
                                 nn.Linear(2 * cfg.width, cfg.width))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.heads, self.head_dim).transpose(1, 2)  # (B, H, n, Dh)

    def forward(self, s: torch.Tensor, lengths: torch.Tensor, x_sum: torch.Tensor) -> torch.Tensor:
        b, length, w = s.shape
        h = self.norm(s)
        src = x_sum if self.personalized else h
        k, v = self.kv(src).chunk(2, dim=-1)
        real = padding_mask(lengths, length)  # (B, L)
        if self.personalized:  # every real sequence position reads the summary tokens
            mask = real[:, None, :, None].expand(b, 1, length, x_sum.shape[1])
            scale = 1.0 / x_sum.shape[1]
        else:
            mask = sliding_window_mask(lengths, length, self.window)
            scale = 1.0 / (self.window or self.cfg.max_len)  # the most keys a query reads
        q, k, v = self._heads(self.q(h)), self._heads(k), self._heads(v)
        alpha = self.head_dim ** -0.5
        if not self.personalized and uses_band(length, self.window):  # only the window is computed
            if self.attention == "softmax":
                att = windowed_softmax_attention(q, k, v, alpha, lengths, self.window)
            else:
                att = windowed_gdpa(q, k, v, self.cfg.activations, alpha, scale, lengths, self.window)
        else:
            att = attend(self.attention, q, k, v, self.cfg.activations, alpha, scale, mask)
        s = s + self.out(att.transpose(1, 2).reshape(b, length, w))
        s = s + self.ffn(s)
        return s * real[:, :, None].to(s.dtype)  # padding stays exactly 0


class KunlunLayer(nn.Module):
    def __init__(self, cfg: KunlunConfig, x_tokens: int, index: int) -> None:
        super().__init__()
        self.index, events = index, cfg.effective_events
        self.compress = GatedCompression(x_tokens, cfg.summary_tokens, cfg.dim)
        self.fresh_hsp = cfg.pools_afresh(index)  # CompSkip: GDPA layers pool afresh, the others reuse H
        # Each event's pooler (HSP, or MeanPool under pooling="mean"); named hsp so checkpoints load.
        self.hsp = nn.ModuleDict({e: pooler(cfg, c) for e, c in events.items() if index < c.depth and self.fresh_hsp})
        personalized = cfg.personalized(index)
        self.seq = nn.ModuleDict({e: SequenceLayer(c, cfg.dim, personalized, cfg.attention, cfg.self_attention_window(c))
                                  for e, c in events.items() if index < c.depth})
        self.interaction = MixtureOfWukongExperts(cfg.experts, cfg.expert_layers, cfg.interaction_tokens, cfg.dim,
                                                  cfg.wukong_rank, cfg.mlp_hidden)
        self.back = nn.Linear(cfg.interaction_tokens, x_tokens)  # interaction tokens -> n_x tokens
        self.x_norm = nn.LayerNorm(cfg.dim)

    def pool(self, seqs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """This layer's fresh pooling: event -> H_e (B, T_e, d), for the events it pools (none on a
        CompSkip layer)."""
        return {e: module(*seqs[e]) for e, module in self.hsp.items()}

    def forward(self, x: torch.Tensor, seqs: dict[str, tuple[torch.Tensor, torch.Tensor]],
                cache: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        x_sum = self.compress(x)  # (B, n_sum, d)
        cache.update(self.pool(seqs))  # (B, T_e, d) each
        tokens = torch.cat([x_sum, *[cache[e] for e in sorted(cache)]], dim=1)  # (B, n_int, d)
        mixed = self.interaction(tokens)
        x = self.x_norm(x + self.back(mixed.transpose(1, 2)).transpose(1, 2))
        seqs = {e: (self.seq[e](s, n, x_sum), n) if e in self.seq else (s, n) for e, (s, n) in seqs.items()}
        return x, seqs


class Kunlun(nn.Module):
    """Dense Kunlun: embedded inputs -> (B, n_int * d) representation for the task heads.

    forward(sparse, dense, sequences):
        sparse: name -> (B, d) embeddings of the non-sequence ids
        dense: (B, D) float
        sequences: event type -> dict with "id_emb" (N, d), "surface", "objective" (N,) int64,
                   "gap_s" (N,) float, "offsets" (B+1,) int64
    """

    def __init__(self, cfg: KunlunConfig, sparse_features: tuple[str, ...], dense_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.events = cfg.effective_events
        self.sparse_features = sparse_features
        x_tokens = len(sparse_features) + cfg.dense_tokens
        self.dense_mlp = nn.Sequential(nn.Linear(dense_dim, cfg.mlp_hidden), nn.GELU(),
                                       nn.Linear(cfg.mlp_hidden, cfg.dense_tokens * cfg.dim))
        self.event_embed = nn.ModuleDict({
            e: nn.ModuleDict({
                "id": nn.Linear(cfg.dim, c.width),  # shared id table (width dim) -> this event's width
                "surface": nn.Embedding(cfg.vocab_sizes["surface"], c.width),
                "objective": nn.Embedding(cfg.vocab_sizes["objective"], c.width),
                "time": nn.Embedding(cfg.time_buckets, c.width),
            }) for e, c in self.events.items()
        })
        self.layers = nn.ModuleList(KunlunLayer(cfg, x_tokens, i) for i in range(cfg.layers))
        # Readout: the final X and sequences, pooled once more, so every layer's updates reach the heads.
        self.final_compress = GatedCompression(x_tokens, cfg.summary_tokens, cfg.dim)
        self.final_hsp = nn.ModuleDict({e: pooler(cfg, c) for e, c in self.events.items()})
        self.out_dim = cfg.interaction_tokens * cfg.dim

    @property
    def length_groups(self) -> int:
        """How many length groups forward computes a batch in (KunlunConfig.length_groups)."""
        return self.cfg.length_groups

    def sequence_tokens(self, event: str, seq: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        c, emb = self.events[event], self.event_embed[event]
        # The most recent max_len events, selected before the token projections: the events cut
        # away cost no projection (same tokens as projecting all, then selecting).
        index, offsets = keep_last(seq["offsets"], c.max_len)
        tokens = (emb["id"](seq["id_emb"][index]) + emb["surface"](seq["surface"][index])
                  + emb["objective"](seq["objective"][index])
                  + emb["time"](time_gap_buckets(seq["gap_s"][index], self.cfg.time_buckets)))
        lengths = offsets[1:] - offsets[:-1]
        return to_padded(tokens, offsets, max(1, int(lengths.max()) if lengths.numel() else 1)), lengths

    def user_representation(self, sparse: dict[str, torch.Tensor], sequences: dict[str, dict[str, torch.Tensor]],
                            user_features: tuple[str, ...] = ("user_id",)) -> torch.Tensor:
        """The user side alone, before any layer reads the ad: each event type's sequence pooled by
        the first layer's pooler (H_e of layer 0, as forward computes it), event types in sorted
        order, then the user's own non-sequence tokens (`user_features`' embeddings, e.g. user_id).

        sparse: name -> (B, d) (only `user_features` are read); sequences as in forward.
        Returns (B, sum_e T_e + len(user_features), d). It reads no ad feature and no dense input
        (the dense tokens mix the user's and the ad's counters), so it can be computed once per user.
        """
        seqs = {e: self.sequence_tokens(e, sequences[e]) for e in self.events}
        pooled = self.layers[0].pool(seqs)  # layer 0 pools every type (depth >= 1, even layer)
        user = torch.stack([sparse[f] for f in user_features], dim=1)  # (B, n_user, d)
        return torch.cat([*(pooled[e] for e in sorted(pooled)), user], dim=1)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                sequences: dict[str, dict[str, torch.Tensor]]) -> torch.Tensor:
        b = dense.shape[0]
        x = torch.cat([torch.stack([sparse[f] for f in self.sparse_features], dim=1),
                       self.dense_mlp(dense).view(b, self.cfg.dense_tokens, self.cfg.dim)], dim=1)  # (B, n_x, d)
        seqs = {e: self.sequence_tokens(e, sequences[e]) for e in self.events}
        if self.cfg.length_groups <= 1:  # the default: one padded block, no sort
            return self.body(x, seqs)
        groups = length_groups(torch.stack([n for _, n in seqs.values()], dim=1), self.cfg.length_groups)
        # Each group padded only to its own longest sequences (gem.model.ops.length_groups); the
        # examples never interact, so this is the same function of the batch, computed with less padding.
        parts = [self.body(x[rows], {e: _trimmed(s[rows], n[rows]) for e, (s, n) in seqs.items()})
                 for rows in groups]
        order = torch.cat(groups)  # (B,) group row -> batch row
        return torch.cat(parts)[torch.argsort(order)]  # (B, n_int * d) in batch order

    def body(self, x: torch.Tensor, seqs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The layers and the readout: X (B, n_x, d), event -> (S_e (B, L_e, w_e), lengths (B,))
        -> (B, n_int * d)."""
        cache: dict[str, torch.Tensor] = {}
        for layer in self.layers:
            x, seqs = layer(x, seqs, cache)
        tokens = [self.final_compress(x)] + [self.final_hsp[e](*seqs[e]) for e in sorted(seqs)]
        return torch.cat(tokens, dim=1).reshape(x.shape[0], -1)  # (B, n_int * d)


def _trimmed(s: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """S (B, L, w) cut to its longest real sequence (at least 1 position), with its lengths (B,)."""
    return s[:, : max(1, int(lengths.max()))], lengths
