"""Forward FLOPs per example, by module, from the config alone (2 FLOPs per multiply-add).

Counts the matrix products (linear layers, attention scores and values, einsums), which is what
dominates and what MFU is computed against; elementwise work (activations, norms, gating) is left
out, as torch.utils.flop_counter does, so the two can be compared (tests/unit/test_flops.py). Sequence
lengths are by default each event type's max_len; `kunlun_batch_flops` counts one batch as it runs
(the real tokens in Kunlun's jagged layout, the padded lengths in its padded one), which is what a
throughput figure should divide by.

Example:
    >>> from gem.model.configs import KunlunConfig
    >>> f = kunlun_flops(KunlunConfig(), n_sparse=8, dense_dim=420, tasks=24, surfaces=6, head_hidden=64,
    ...                  shared_experts=2)
    >>> f["total"] == sum(v for k, v in f.items() if k != "total")
    True
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import torch

from gem.model.configs import (
    DLRMConfig,
    EventConfig,
    HSTUConfig,
    InterFormerConfig,
    KunlunConfig,
    ModelConfig,
    WukongConfig,
)
from gem.model.ops.gdpa import uses_band
from gem.model.ops.length_groups import length_groups


def _linear(n_in: int, n_out: int, rows: int = 1) -> int:
    return 2 * rows * n_in * n_out


def _pool(e: EventConfig, dim: int, examples: int, tokens: int, length: int, pooling: str) -> int:
    """One event type's pooling over a batch of `examples` computing `tokens` token positions, padded
    to `length` where it runs per example: HSP (its seed scores per token, the weighted sum of
    values per example over `length` positions, as both layouts run it), or pooling="mean"'s
    projection (the mean itself is additions, left out like the other elementwise work)."""
    if pooling != "hsp":
        return examples * _linear(e.width, e.summary_tokens * dim)
    kv = _linear(e.width, 2 * e.width, tokens)
    scores = 2 * e.seeds * tokens * e.width  # all heads together
    values = 2 * e.seeds * examples * length * e.width
    kron = 2 * e.kron_rank * (e.seeds * e.summary_tokens * e.width + e.summary_tokens * e.width * dim)
    return kv + scores + values + examples * kron


def _band(length: int, window: int, width: int) -> int:
    """Scores and values of the blocked band form (gem.model.ops.band) over `length` positions:
    blocks of min(window, length) queries, each against twice as many keys."""
    if length == 0:
        return 0
    block = min(window, length)
    return 2 * (2 * -(-length // block) * block * 2 * block * width)


def _sequence_layer(e: EventConfig, dim: int, examples: int, tokens: int, length: int, summary_tokens: int,
                    personalized: bool, window: int | None, jagged: bool, full_blocks: bool) -> int:
    """One event type's sequence layer over a batch of `examples` that computes `tokens` positions:
    the real tokens (jagged layout), or examples x `length` (padded to `length`). window: the odd
    layers' self-attention window (None: the whole causal prefix). GDPA and softmax attention compute
    the same two products (scores, weights @ V). full_blocks: the jagged stream's band counted as in a
    large batch (every block `window` tokens, so each token scores 2 x window keys), not this one's."""
    w = e.width
    per_token = _linear(w, w, tokens) * 2 + _linear(w, 2 * w, tokens) + _linear(2 * w, w, tokens)  # q, out, ffn
    if personalized:  # both layouts: per example, its queries padded to `length` against its summary tokens
        kv = _linear(dim, 2 * w, examples * summary_tokens)
        attention = 2 * (2 * examples * length * summary_tokens * w)
    else:
        kv = _linear(w, 2 * w, tokens)
        if jagged:  # the batch's tokens as one stream in the band form (gem.model.ops.jagged_attention)
            stream_window = window or e.max_len
            attention = 2 * (2 * tokens * 2 * stream_window * w) if full_blocks else _band(tokens, stream_window, w)
        elif window is not None and uses_band(length, window):
            attention = examples * _band(length, window, w)
        else:
            attention = examples * 2 * (2 * length * length * w)
    return per_token + kv + attention


def _wukong_layer(tokens: int, dim: int, rank: int, fmb_tokens: int, hidden: int) -> int:
    return (2 * (2 * tokens * dim * rank) + _linear(tokens * rank, hidden) + _linear(hidden, fmb_tokens * dim)
            + _linear(tokens, tokens - fmb_tokens, dim))


def _compress(tokens: int, out_tokens: int, dim: int) -> int:
    return _linear(tokens, out_tokens, dim) + 2 * _linear(dim, dim, out_tokens)


def kunlun_flops(cfg: KunlunConfig, n_sparse: int, dense_dim: int, tasks: int, surfaces: int, head_hidden: int,
                 shared_experts: int, lengths: dict[str, int] | None = None) -> dict[str, int]:
    """Forward FLOPs per example (every sequence at `lengths`, default each type's max_len), by
    module name, plus "total"; every ablation switch of the config (attention, pooling, compskip,
    sliding_window, event_personalization) and the sequence layout counted as it computes. The
    jagged layout's window attention is counted as in a batch whose token stream fills its blocks
    (exact for B examples when B x length is a multiple of the window)."""
    lengths = lengths or {e: c.max_len for e, c in cfg.events.items()}
    return _kunlun_batch(cfg, 1, {e: (n, n) for e, n in lengths.items()}, n_sparse, dense_dim, tasks, surfaces,
                         head_hidden, shared_experts, full_blocks=True)


def _event_modules(cfg: KunlunConfig, event: str, examples: int, tokens: int, length: float,
                   full_blocks: bool = False) -> dict[str, int]:
    """One event type's sequence modules over a batch, by module name: its id projection, its
    pooling in each layer that pools it afresh, its sequence layers, its readout pooling. `tokens`
    positions are computed per token; per-example products run on examples x `length`."""
    c, d = cfg.effective_events[event], cfg.dim
    jagged = cfg.sequence_layout == "jagged"
    out = {"event_id_projection": _linear(d, c.width, tokens)}
    for i in range(min(cfg.layers, c.depth)):
        if cfg.pools_afresh(i):
            out[f"layer{i}.pooling"] = _pool(c, d, examples, tokens, length, cfg.pooling)
        out[f"layer{i}.sequences"] = _sequence_layer(c, d, examples, tokens, length, cfg.summary_tokens,
                                                     cfg.personalized(i), cfg.self_attention_window(c), jagged,
                                                     full_blocks)
    out["readout"] = _pool(c, d, examples, tokens, length, cfg.pooling)
    return {k: round(v) for k, v in out.items()}


def _kunlun_batch(cfg: KunlunConfig, examples: int, computed: Mapping[str, tuple[int, int]], n_sparse: int,
                  dense_dim: int, tasks: int, surfaces: int, head_hidden: int, shared_experts: int,
                  full_blocks: bool = False) -> dict[str, int]:
    """A batch of `examples`; computed: event type -> (token positions its sequence modules compute
    on, the length each example's per-example products are padded to)."""
    x_tokens, d, n_int = n_sparse + cfg.dense_tokens, cfg.dim, cfg.interaction_tokens
    block = n_int // cfg.experts
    out: dict[str, int] = {
        "dense_mlp": examples * (_linear(dense_dim, cfg.mlp_hidden) + _linear(cfg.mlp_hidden, cfg.dense_tokens * d)),
        "event_id_projection": 0,
    }
    for i in range(cfg.layers):
        out[f"layer{i}.compress"] = examples * _compress(x_tokens, cfg.summary_tokens, d)
        if cfg.pools_afresh(i):
            out[f"layer{i}.pooling"] = 0
        out[f"layer{i}.wukong_experts"] = examples * cfg.experts * cfg.expert_layers * _wukong_layer(
            block, d, cfg.wukong_rank, max(1, block // 2), cfg.mlp_hidden)
        out[f"layer{i}.back_projection"] = examples * _linear(n_int, x_tokens, d)
        out[f"layer{i}.sequences"] = 0
    out["readout"] = examples * _compress(x_tokens, cfg.summary_tokens, d)
    for event in cfg.effective_events:
        for module, flops in _event_modules(cfg, event, examples, *computed[event], full_blocks).items():
            out[module] += flops
    out["heads"] = examples * heads_flops(n_int * d, tasks, surfaces, head_hidden, shared_experts)
    out["total"] = sum(out.values())
    return out


def jagged_padding_flops(cfg: KunlunConfig, lengths: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, int]]:
    """Per event type, (its sequence FLOPs on real tokens, as the jagged layout runs them) for one
    batch: the per-example products (the personalized layers' attention to the summary tokens, the
    weighted sum of HSP's values) run on each example's queries padded to the batch's longest; every
    other sequence FLOP runs on the real tokens. 1 - first / second is the padding's share."""
    if cfg.sequence_layout != "jagged":
        raise ValueError("jagged_padding_flops counts the jagged layout")
    out = {}
    for event, c in cfg.effective_events.items():
        kept = [min(int(n), c.max_len) for n in lengths[event]]
        examples, tokens = len(kept), sum(kept)
        longest = max(1, max(kept, default=1))
        run = sum(_event_modules(cfg, event, examples, tokens, longest).values())
        real = sum(_event_modules(cfg, event, examples, tokens, tokens / max(examples, 1)).values())
        out[event] = (real, run)
    return out


def kunlun_batch_flops(cfg: KunlunConfig, lengths: Mapping[str, Sequence[int]], n_sparse: int, dense_dim: int,
                       tasks: int, surfaces: int, head_hidden: int, shared_experts: int) -> dict[str, int]:
    """Forward FLOPs of one batch as Kunlun runs it, by module, plus "total".

    lengths: event type -> each example's sequence length as the loader cut it (B values each).
    The model keeps each example's most recent max_len events. In the jagged layout (the default)
    every sequence module computes on those kept tokens alone. In the padded layout the batch is
    split into cfg.length_groups groups of similar lengths (gem.model.ops.length_groups) and every
    event type of a group is padded to the group's longest kept sequence (at least 1 position);
    the id projection still runs on the kept events alone (it precedes padding). So the count
    follows the batch, not the configured maximum.
    """
    events = cfg.effective_events
    kept = torch.tensor([[min(int(n), c.max_len) for n in lengths[e]] for e, c in events.items()],
                        dtype=torch.int64).T.reshape(-1, len(events))  # (B, E)
    args = (n_sparse, dense_dim, tasks, surfaces, head_hidden, shared_experts)
    if cfg.sequence_layout == "jagged":  # the kept tokens, and the batch's longest for the per-example products
        computed = {e: (int(kept[:, i].sum()), max(1, int(kept[:, i].max()))) for i, e in enumerate(events)}
        return _kunlun_batch(cfg, kept.shape[0], computed, *args)
    out: dict[str, int] = {}
    for rows in length_groups(kept, cfg.length_groups):
        padded = {e: max(1, int(kept[rows, i].max())) for i, e in enumerate(events)}
        group = _kunlun_batch(cfg, rows.numel(), {e: (rows.numel() * n, n) for e, n in padded.items()}, *args)
        for k, v in group.items():
            if k != "total":
                out[k] = out.get(k, 0) + v
    out["event_id_projection"] = sum(_linear(cfg.dim, c.width, int(kept[:, i].sum())) for i, c in enumerate(events.values()))
    out["total"] = sum(out.values())
    return out


def heads_flops(in_dim: int, tasks: int, surfaces: int, hidden: int, shared_experts: int) -> int:
    expert = _linear(in_dim, hidden) + _linear(hidden, hidden)
    towers = 2 * hidden * tasks  # every task's tower on each expert's output (DomainExpertHeads.forward)
    return (surfaces + shared_experts) * (expert + towers) + _linear(in_dim, tasks * (1 + shared_experts))


def _mlp(sizes: list[int] | tuple[int, ...]) -> int:
    return sum(_linear(a, b) for a, b in itertools.pairwise(sizes))


def hstu_body_flops(cfg: HSTUConfig, n_sparse: int, dense_dim: int, length: int | None = None) -> dict[str, int]:
    """HSTU at sequence length `length` (default: every type at max_len, plus the candidate token)."""
    length = length if length is not None else sum(cfg.max_len.values()) + 1
    d = cfg.dim
    per_layer = _linear(d, 4 * d, length) + _linear(d, d, length) + 2 * (2 * length * length * d)
    out = {f"layer{i}.stu": per_layer for i in range(cfg.layers)}
    out["context_mlp"] = _mlp([n_sparse * d + dense_dim, cfg.mlp_hidden, d])
    return out


def interformer_body_flops(cfg: InterFormerConfig, n_sparse: int, dense_dim: int,
                           length: int | None = None) -> dict[str, int]:
    """InterFormer at history length `length` (default: every type at max_len), CLS tokens included."""
    d, n_x = cfg.dim, n_sparse + cfg.dense_tokens
    s_len = cfg.cls_tokens + (length if length is not None else sum(cfg.max_len.values()))
    n_ssum, n_int = cfg.sequence_summary_tokens, n_sparse + cfg.dense_tokens + cfg.sequence_summary_tokens

    def summary() -> int:
        kv = _linear(d, 2 * d, s_len)
        pma = 2 * (2 * cfg.pma_tokens * s_len * d)
        return kv + pma + 2 * _linear(d, d, n_ssum)  # + the gate's MLP

    out: dict[str, int] = {"dense_mlp": _mlp([dense_dim, cfg.mlp_hidden, cfg.dense_tokens * d])}
    for i in range(cfg.layers):
        out[f"layer{i}.cross"] = _compress(n_x, cfg.summary_tokens, d) + summary()
        out[f"layer{i}.interaction"] = (_wukong_layer(n_int, d, cfg.wukong_rank, n_int // 2, cfg.mlp_hidden)
                                        + _linear(n_int, n_x, d))
        pffn = 2 * d * cfg.summary_tokens * d + _linear(d, d, s_len)
        mha = _linear(d, 3 * d, s_len) + 2 * (2 * s_len * s_len * d) + _linear(d, d, s_len)
        out[f"layer{i}.sequence"] = pffn + mha + _linear(d, 2 * d, s_len) + _linear(2 * d, d, s_len)
    out["readout"] = _compress(n_x, cfg.summary_tokens, d) + summary()
    return out


def wukong_body_flops(cfg: WukongConfig, n_sparse: int, dense_dim: int) -> dict[str, int]:
    tokens = n_sparse + cfg.dense_tokens + len(cfg.max_len)
    out = {"dense_mlp": _mlp([dense_dim, cfg.mlp_hidden, cfg.dense_tokens * cfg.dim])}
    for i in range(cfg.layers):
        out[f"layer{i}.wukong"] = _wukong_layer(tokens, cfg.dim, cfg.rank, tokens // 2, cfg.mlp_hidden)
    return out


def dlrm_body_flops(cfg: DLRMConfig, n_sparse: int, dense_dim: int) -> dict[str, int]:
    n = n_sparse + len(cfg.max_len)  # id features + one pooled bag per event type
    return {
        "dense_arch": _mlp([dense_dim, *cfg.dense_arch]),
        "interaction": 2 * (n + 1) * (n + 1) * cfg.dim,  # the (F+1) x (F+1) Gram matrix
        "over_arch": _mlp([cfg.dim + n * (n + 1) // 2, *cfg.over_arch]),
    }


def body_out_dim(cfg: ModelConfig, n_sparse: int) -> int:
    """The width of the representation the heads read (as the modules compute it)."""
    if cfg.arch == "kunlun":
        return cfg.kunlun.interaction_tokens * cfg.kunlun.dim
    if cfg.arch == "hstu":
        return 2 * cfg.hstu.dim
    if cfg.arch == "interformer":
        c = cfg.interformer
        return (c.summary_tokens + c.sequence_summary_tokens) * c.dim
    if cfg.arch == "wukong":
        return (n_sparse + cfg.wukong.dense_tokens + len(cfg.wukong.max_len)) * cfg.wukong.dim
    return cfg.dlrm.over_arch[-1]


def model_flops(cfg: ModelConfig, n_sparse: int, dense_dim: int, tasks: int, surfaces: int) -> dict[str, int]:
    """Forward FLOPs per example of any architecture's config, by module, plus "heads" and "total";
    sequences at their configured maximum lengths."""
    heads = heads_flops(body_out_dim(cfg, n_sparse), tasks, surfaces, cfg.heads.hidden, cfg.heads.shared_experts)
    if cfg.arch == "kunlun":
        return kunlun_flops(cfg.kunlun, n_sparse, dense_dim, tasks, surfaces, cfg.heads.hidden,
                            cfg.heads.shared_experts)
    body = {
        "hstu": lambda: hstu_body_flops(cfg.hstu, n_sparse, dense_dim),
        "interformer": lambda: interformer_body_flops(cfg.interformer, n_sparse, dense_dim),
        "wukong": lambda: wukong_body_flops(cfg.wukong, n_sparse, dense_dim),
        "dlrm": lambda: dlrm_body_flops(cfg.dlrm, n_sparse, dense_dim),
    }[cfg.arch]()
    out = {**body, "heads": heads}
    out["total"] = sum(out.values())
    return out
