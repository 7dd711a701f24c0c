"""The dense optimizer's learning rate as a pure function of the step (no scheduler state).

Linear warmup over `train.lr_warmup_steps`, then `train.lr_decay`: "constant", or "cosine" down to
`train.lr_min_ratio * train.lr` at step `train.steps` (Loshchilov & Hutter, SGDR, arXiv 1608.03983).
Warmup matters most for warm starts: a day's run loads yesterday's weights with a fresh AdamW, whose
first updates are about `lr` per weight whatever the gradient's size. The decay lets the last
steps settle instead of ending on a full-size noisy step. Being a function of the step alone, a
resumed run follows the same rates as an uninterrupted one.
"""

from __future__ import annotations

import math

from gem.config import TrainConfig


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """The rate of step `step` (0-based: the step about to run) of a `cfg.steps`-step run."""
    if step < cfg.lr_warmup_steps:
        return cfg.lr * (step + 1) / cfg.lr_warmup_steps
    if cfg.lr_decay == "constant":
        return cfg.lr
    span = max(1, cfg.steps - cfg.lr_warmup_steps)
    progress = min(1.0, (step - cfg.lr_warmup_steps) / span)
    return cfg.lr * (cfg.lr_min_ratio + (1.0 - cfg.lr_min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))
