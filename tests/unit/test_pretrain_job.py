"""jobs.pretrain before the mixture's window holds a training day: it publishes nothing and says
why (mix skipped on purpose), instead of pointing at `jobs.mix` as if a step were missing."""

from __future__ import annotations

from gem.lakehouse.commit import StageContext
from jobs import pretrain
from tests.support import make_config


def test_pretrain_before_any_training_day_skips_and_says_why(tmp_path, capsys):
    cfg = make_config(tmp_path)
    result = pretrain.run(StageContext(cfg), cfg.start_ds)
    assert not result.published
    out = capsys.readouterr().out
    assert "nothing to train on yet" in out and "mix skipped on purpose" in out and "jobs.mix" not in out
