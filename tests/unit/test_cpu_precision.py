"""train.cpu_precision: fp32 by default, bf16 autocast when asked, and "auto" = bf16 exactly on CPUs
that multiply bf16 natively (as torch reports the CPU's instructions)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gem.config import ConfigError, TrainConfig, load_config
from gem.train import precision
from tests.support import REPO, TINY_TRAIN, tiny_trainer


@pytest.mark.parametrize(("caps", "native"), [
    ({"avx512_bf16": True, "amx_bf16": False}, True),
    ({"avx512_bf16": False, "amx_bf16": True}, True),
    ({"avx512_bf16": False, "amx_bf16": False}, False),
    ({}, False),
])
def test_auto_is_bf16_only_with_native_bf16_matmuls(monkeypatch, caps, native):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    assert precision.native_bf16() is native
    assert precision.cpu_autocast("auto") is native
    assert precision.cpu_autocast("bf16") is True
    assert precision.cpu_autocast("fp32") is False


def test_trainer_autocasts_as_the_precision_says(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_bf16": False})
    assert not tiny_trainer(tmp_path / "default").autocast  # fp32 unless a config opts in
    assert not tiny_trainer(tmp_path / "auto", cfg=dataclasses.replace(TINY_TRAIN, cpu_precision="auto")).autocast
    assert tiny_trainer(tmp_path / "bf16", cfg=dataclasses.replace(TINY_TRAIN, cpu_precision="bf16")).autocast


def test_demo_config_opts_in_and_a_bad_value_is_refused():
    assert TrainConfig().cpu_precision == "fp32"
    assert load_config(REPO / "configs" / "demo.yaml", environ={}).train.cpu_precision == "auto"
    with pytest.raises(ConfigError, match="train.cpu_precision must be one of"):
        TrainConfig(cpu_precision="fp16")
