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

Sequence layout (KunlunConfig.sequence_layout): by default each S_e stays jagged, a Stream of its
real tokens (N_e, w_e) with offsets, through every layer (gem.model.ops.jagged_attention), so no
padded position is computed; "padded" runs the same layers on (B, L_e, w_e) blocks under masks, the
reference the jagged form is tested against.

Shapes: X (B, n_x, d); S_e (N_e, w_e) jagged or (B, L_e, w_e) padded; H_e (B, T_e, d).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from gem.model.configs import EventConfig, KunlunConfig
from gem.model.flops import jagged_padding_flops
from gem.model.ops.attention import attend, attend_window
from gem.model.ops.gdpa import uses_band
from gem.model.ops.jagged import JaggedLayout, jagged_mean, keep_last
from gem.model.ops.jagged_attention import seed_pooling, summary_attention, window_attention
from gem.model.ops.length_groups import length_groups, padded_positions
from gem.model.ops.masks import padding_mask, sliding_window_mask
from gem.model.ops.sum_kron import SumKronLinear
from gem.model.ops.time_encoding import time_gap_buckets
from gem.model.wukong import MixtureOfWukongExperts


class Stream(NamedTuple):
    """One event type's sequences in the jagged layout: every example's real tokens back to back."""

    values: torch.Tensor  # (N, w)
    layout: JaggedLayout  # offsets, each token's example and padded position: one per batch, every layer's

    @property
    def offsets(self) -> torch.Tensor:
        return self.layout.offsets  # (B+1,)

    @property
    def rows(self) -> torch.Tensor:
        return self.layout.rows  # (N,)

    @property
    def examples(self) -> int:
        return self.layout.examples


class Padded(NamedTuple):
    """One event type's sequences in the padded layout (the reference): zero after each length."""

    values: torch.Tensor  # (B, L, w)
    lengths: torch.Tensor  # (B,)


Sequences = Stream | Padded


def padded(stream: Stream) -> Padded:
    """The stream as (B, L, w) blocks, L its longest sequence (at least 1 position)."""
    return Padded(stream.layout.pad(stream.values), stream.layout.lengths)


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

    def forward(self, seq: Sequences) -> torch.Tensor:
        alpha, scale = self.head_dim ** -0.5, 1.0 / self.cfg.max_len
        if isinstance(seq, Stream):
            n = seq.values.shape[0]
            k, v = self.kv(seq.values).view(n, 2, self.heads, self.head_dim).unbind(1)  # (N, H, Dh) x2
            pooled = seed_pooling(self.attention, self.seeds.view(-1, self.heads, self.head_dim), k, v, seq.layout,
                                  self.cfg.activations, alpha, scale)  # (B, H, seeds, Dh)
        else:
            s, lengths = seq
            b, length, _ = s.shape
            k, v = self.kv(s).view(b, length, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (B, H, L, Dh) x2
            q = self.seeds.view(1, -1, self.heads, self.head_dim).transpose(1, 2).expand(b, -1, -1, -1)
            mask = padding_mask(lengths, length)[:, None, None, :]  # (B, 1, 1, L)
            pooled = attend(self.attention, q, k, v, self.cfg.activations, alpha, scale, mask)  # (B, H, seeds, Dh)
        b = pooled.shape[0]
        pooled = pooled.transpose(1, 2).reshape(b, self.cfg.seeds, self.cfg.width)  # (B, seeds, w)
        return self.compress(pooled)  # (B, T, d)


class MeanPool(nn.Module):
    """The pooling="mean" ablation of HSP: each sequence's mean over its real positions, projected
    to T tokens of width d (as many as HSP gives, so the interaction arch's token count is unchanged).
    forward: a Stream or Padded -> (B, T, d); an empty sequence pools to the projection's bias."""

    def __init__(self, cfg: EventConfig, dim: int) -> None:
        super().__init__()
        self.tokens, self.dim = cfg.summary_tokens, dim
        self.proj = nn.Linear(cfg.width, cfg.summary_tokens * dim)

    def forward(self, seq: Sequences) -> torch.Tensor:
        if isinstance(seq, Stream):
            mean = jagged_mean(seq.values, seq.offsets, seq.rows)  # (B, w)
        else:
            s, lengths = seq
            real = padding_mask(lengths, s.shape[1])[:, :, None].to(s.dtype)  # (B, L, 1)
            mean = (s * real).sum(dim=1) / lengths.clamp(min=1)[:, None].to(s.dtype)  # (B, w)
        return self.proj(mean).view(mean.shape[0], self.tokens, self.dim)


def pooler(cfg: KunlunConfig, event: EventConfig) -> nn.Module:
    """The module that pools one event type's sequence to its T_e tokens: HSP or MeanPool (cfg.pooling)."""
    return HSP(event, cfg.dim, cfg.attention) if cfg.pooling == "hsp" else MeanPool(event, cfg.dim)


class SequenceLayer(nn.Module):
    """One layer of one event type's stream: attention from X_sum (personalized, even layers) or
    causal self-attention within `window` (odd layers; None = the whole prefix), then an FFN.
    forward: a Stream (N, w) or Padded (B, L, w) sequence, X_sum (B, n_sum, d) -> the same layout
    (a Padded one exactly 0 at padding)."""

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

    def forward(self, seq: Sequences, x_sum: torch.Tensor) -> Sequences:
        if isinstance(seq, Padded):
            return self._padded(seq, x_sum)
        s = seq.values
        n, w = s.shape
        h = self.norm(s)
        q = self.q(h).view(n, self.heads, self.head_dim)  # (N, H, Dh)
        alpha = self.head_dim ** -0.5
        if self.personalized:  # every token reads its example's summary tokens
            k, v = (self._heads(t) for t in self.kv(x_sum).chunk(2, dim=-1))  # (B, H, n_sum, Dh) x2
            att = summary_attention(self.attention, q, k, v, seq.layout, self.cfg.activations, alpha,
                                    1.0 / x_sum.shape[1])
        else:
            k, v = (t.reshape(n, self.heads, self.head_dim) for t in self.kv(h).chunk(2, dim=-1))  # (N, H, Dh) x2
            window = self.window or self.cfg.max_len  # no kept sequence is longer than max_len
            att = window_attention(self.attention, q, k, v, seq.rows, self.cfg.activations, alpha, 1.0 / window,
                                   window)
        s = s + self.out(att.reshape(n, w))  # (N, w)
        return seq._replace(values=s + self.ffn(s))

    def _padded(self, seq: Padded, x_sum: torch.Tensor) -> Padded:
        """The same layer on (B, L, w) blocks under masks: the reference of the jagged form."""
        s, lengths = seq
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
            att = attend_window(self.attention, q, k, v, self.cfg.activations, alpha, scale, lengths, self.window)
        else:
            att = attend(self.attention, q, k, v, self.cfg.activations, alpha, scale, mask)
        s = s + self.out(att.transpose(1, 2).reshape(b, length, w))
        s = s + self.ffn(s)
        return Padded(s * real[:, :, None].to(s.dtype), lengths)  # padding stays exactly 0


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

    def pool(self, seqs: dict[str, Sequences]) -> dict[str, torch.Tensor]:
        """This layer's fresh pooling: event -> H_e (B, T_e, d), for the events it pools (none on a
        CompSkip layer)."""
        return {e: module(seqs[e]) for e, module in self.hsp.items()}

    def forward(self, x: torch.Tensor, seqs: dict[str, Sequences],
                cache: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Sequences]]:
        x_sum = self.compress(x)  # (B, n_sum, d)
        cache.update(self.pool(seqs))  # (B, T_e, d) each
        tokens = torch.cat([x_sum, *[cache[e] for e in sorted(cache)]], dim=1)  # (B, n_int, d)
        mixed = self.interaction(tokens)
        x = self.x_norm(x + self.back(mixed.transpose(1, 2)).transpose(1, 2))
        seqs = {e: self.seq[e](s, x_sum) if e in self.seq else s for e, s in seqs.items()}
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
    def padding_measure(self) -> str:
        """What sequence_padding's pairs count."""
        return "sequence FLOPs" if self.cfg.sequence_layout == "jagged" else "padded sequence blocks"

    def sequence_padding(self, lengths: dict[str, torch.Tensor]) -> dict[str, tuple[int, int]]:
        """Per event type, (real, computed) for a batch of sequence lengths (B,) each, as forward runs
        it: in the jagged layout its sequence FLOPs on real tokens and as run (only the per-example
        products pad, gem.model.flops.jagged_padding_flops); in the padded layout the real events
        and the positions of the padded blocks (of each length group)."""
        if self.cfg.sequence_layout == "jagged":
            return jagged_padding_flops(self.cfg, {e: n.tolist() for e, n in lengths.items()})
        events = list(lengths)
        real, padded = padded_positions(torch.stack([lengths[e] for e in events], dim=1), self.cfg.length_groups)
        return {e: (int(r), int(p)) for e, r, p in zip(events, real, padded, strict=True)}

    def sequence_tokens(self, event: str, seq: dict[str, torch.Tensor]) -> Stream:
        """One event type's kept events as a Stream of (N, w_e) tokens."""
        c, emb = self.events[event], self.event_embed[event]
        # The most recent max_len events, selected before the token projections: the events cut
        # away cost no projection (same tokens as projecting all, then selecting).
        index, offsets = keep_last(seq["offsets"], c.max_len)
        tokens = (emb["id"](seq["id_emb"][index]) + emb["surface"](seq["surface"][index])
                  + emb["objective"](seq["objective"][index])
                  + emb["time"](time_gap_buckets(seq["gap_s"][index], self.cfg.time_buckets)))
        return Stream(tokens, JaggedLayout.of(offsets))

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
        streams = {e: self.sequence_tokens(e, sequences[e]) for e in self.events}
        if self.cfg.sequence_layout == "jagged":  # the default: no padded position anywhere
            return self.body(x, streams)
        seqs = {e: padded(s) for e, s in streams.items()}
        if self.cfg.length_groups <= 1:
            return self.body(x, seqs)
        groups = length_groups(torch.stack([s.lengths for s in seqs.values()], dim=1), self.cfg.length_groups)
        # Each group padded only to its own longest sequences (gem.model.ops.length_groups); the
        # examples never interact, so this is the same function of the batch, computed with less padding.
        parts = [self.body(x[rows], {e: _trimmed(s, rows) for e, s in seqs.items()}) for rows in groups]
        order = torch.cat(groups)  # (B,) group row -> batch row
        return torch.cat(parts)[torch.argsort(order)]  # (B, n_int * d) in batch order

    def body(self, x: torch.Tensor, seqs: dict[str, Sequences]) -> torch.Tensor:
        """The layers and the readout: X (B, n_x, d), event -> its sequences (a Stream, or Padded
        blocks) -> (B, n_int * d)."""
        cache: dict[str, torch.Tensor] = {}
        for layer in self.layers:
            x, seqs = layer(x, seqs, cache)
        tokens = [self.final_compress(x)] + [self.final_hsp[e](seqs[e]) for e in sorted(seqs)]
        return torch.cat(tokens, dim=1).reshape(x.shape[0], -1)  # (B, n_int * d)


def _trimmed(seq: Padded, rows: torch.Tensor) -> Padded:
    """The `rows` of padded blocks, cut to their longest real sequence (at least 1 position)."""
    lengths = seq.lengths[rows]
    return Padded(seq.values[rows, : max(1, int(lengths.max()))], lengths)
