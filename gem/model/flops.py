"""Forward FLOPs per example, by module, from the config alone (2 FLOPs per multiply-add).

Counts the matrix products (linear layers, attention scores and values, einsums), which is what
dominates and what MFU is measured against; elementwise work (activations, norms, gating) is left
out, as torch.utils.flop_counter does, so the two can be compared (tests/test_flops.py). Sequence
lengths are the padded lengths the model computes on: by default each event type's max_len.

Example:
    >>> from gem.model.configs import KunlunConfig
    >>> f = kunlun_flops(KunlunConfig(), n_sparse=8, dense_dim=420, tasks=24, surfaces=6, head_hidden=64,
    ...                  shared_experts=2)
    >>> f["total"] == sum(v for k, v in f.items() if k != "total")
    True
"""

from __future__ import annotations

from gem.model.configs import EventConfig, KunlunConfig


def _linear(n_in: int, n_out: int, rows: int = 1) -> int:
    return 2 * rows * n_in * n_out


def _hsp(e: EventConfig, dim: int, length: int) -> int:
    kv = _linear(e.width, 2 * e.width, length)
    attention = 2 * (2 * e.seeds * length * e.width)  # scores and values, all heads together
    kron = 2 * e.kron_rank * (e.seeds * e.summary_tokens * e.width + e.summary_tokens * e.width * dim)
    return kv + attention + kron


def _sequence_layer(e: EventConfig, dim: int, length: int, summary_tokens: int, personalized: bool) -> int:
    w = e.width
    q, out = _linear(w, w, length), _linear(w, w, length)
    keys = summary_tokens if personalized else length
    kv = _linear(dim if personalized else w, 2 * w, keys)
    attention = 2 * (2 * length * keys * w)
    ffn = _linear(w, 2 * w, length) + _linear(2 * w, w, length)
    return q + kv + attention + out + ffn


def _wukong_layer(tokens: int, dim: int, rank: int, fmb_tokens: int, hidden: int) -> int:
    return (2 * (2 * tokens * dim * rank) + _linear(tokens * rank, hidden) + _linear(hidden, fmb_tokens * dim)
            + _linear(tokens, tokens - fmb_tokens, dim))


def _compress(tokens: int, out_tokens: int, dim: int) -> int:
    return _linear(tokens, out_tokens, dim) + 2 * _linear(dim, dim, out_tokens)


def kunlun_flops(cfg: KunlunConfig, n_sparse: int, dense_dim: int, tasks: int, surfaces: int, head_hidden: int,
                 shared_experts: int, lengths: dict[str, int] | None = None) -> dict[str, int]:
    """Forward FLOPs per example, by module name, plus "total"."""
    lengths = lengths or {e: c.max_len for e, c in cfg.events.items()}
    x_tokens, d, n_int = n_sparse + cfg.dense_tokens, cfg.dim, cfg.interaction_tokens
    block = n_int // cfg.experts
    out: dict[str, int] = {
        "dense_mlp": _linear(dense_dim, cfg.mlp_hidden) + _linear(cfg.mlp_hidden, cfg.dense_tokens * d),
        "event_id_projection": sum(_linear(d, c.width, lengths[e]) for e, c in cfg.events.items()),
    }
    for i in range(cfg.layers):
        out[f"layer{i}.compress"] = _compress(x_tokens, cfg.summary_tokens, d)
        if i % 2 == 0:
            out[f"layer{i}.hsp"] = sum(_hsp(c, d, lengths[e]) for e, c in cfg.events.items() if i < c.depth)
        out[f"layer{i}.wukong_experts"] = cfg.experts * cfg.expert_layers * _wukong_layer(
            block, d, cfg.wukong_rank, max(1, block // 2), cfg.mlp_hidden)
        out[f"layer{i}.back_projection"] = _linear(n_int, x_tokens, d)
        out[f"layer{i}.sequences"] = sum(
            _sequence_layer(c, d, lengths[e], cfg.summary_tokens, personalized=i % 2 == 0)
            for e, c in cfg.events.items() if i < c.depth)
    out["readout"] = _compress(x_tokens, cfg.summary_tokens, d) + sum(
        _hsp(c, d, lengths[e]) for e, c in cfg.events.items())
    out["heads"] = heads_flops(n_int * d, tasks, surfaces, head_hidden, shared_experts)
    out["total"] = sum(out.values())
    return out


def heads_flops(in_dim: int, tasks: int, surfaces: int, hidden: int, shared_experts: int) -> int:
    expert = _linear(in_dim, hidden) + _linear(hidden, hidden)
    return (surfaces + shared_experts) * expert + _linear(in_dim, tasks * (1 + shared_experts))
