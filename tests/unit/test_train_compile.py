"""train.compile on the CPU: torch.compile (inductor, dynamic shapes) of the dense body trains as eager does.

Slow tier: inductor builds the tiny model's kernels with the host's C++ compiler, which is what
this tests, and from a cold cache (a fresh clone's) that takes minutes on 2 cores."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.support import TINY_TRAIN, tiny_trainer


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # no compiled frame of another test's model is reused, none left behind
    yield
    torch._dynamo.reset()


@pytest.mark.slow
def test_compiled_body_trains_as_eager_and_its_checkpoints_load_uncompiled(tmp_path):
    """Ten steps over six batches of different token counts: the same losses as eager (to float
    rounding: inductor fuses and reorders), parameters that stay close, and checkpoints whose
    parameter names an eager trainer loads."""
    cfg = dataclasses.replace(TINY_TRAIN, compile=True)
    eager = tiny_trainer(tmp_path / "eager")
    compiled = tiny_trainer(tmp_path / "compiled", cfg=cfg)
    # Whether torch.compile traced the body's first layer on its last call, written into a tensor (a
    # Python-side record would itself be guarded on, and recompile the body at every call).
    traced = {"eager": torch.tensor(-1), "compiled": torch.tensor(-1)}

    def record(flag: torch.Tensor):
        def hook(module, args) -> None:  # returns None: the layer's inputs stay as they are
            flag.fill_(int(torch.compiler.is_compiling()))
        return hook

    for name, trainer in (("eager", eager), ("compiled", compiled)):
        trainer.task.body.layers[0].register_forward_pre_hook(record(traced[name]))
    want, got = eager.fit(), compiled.fit()
    assert traced["eager"].item() == 0 and traced["compiled"].item() == 1
    assert len(got.losses) == len(want.losses) == 10
    assert got.losses == pytest.approx(want.losses, rel=1e-4)
    assert got.losses[0] != got.losses[-1]  # it trained
    state = compiled.task.state_dict()
    for name, tensor in eager.task.state_dict().items():
        torch.testing.assert_close(state[name], tensor, rtol=1e-3, atol=1e-4, msg=name)

    reloaded = tiny_trainer(tmp_path / "compiled")  # an eager trainer over the compiled run's checkpoints
    assert reloaded.resume() and reloaded.step == 10
    for name, tensor in reloaded.task.state_dict().items():
        assert torch.equal(tensor, state[name]), name
