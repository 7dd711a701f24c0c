"""LoopFM history codes: INT4 quantization (straight-through) and 4-bit packing round-trip exactly;
the autoencoder learns a Matryoshka code (shorter prefixes reconstruct worse) while training beside
the foundation model leaves every FM gradient exactly as it was; the student's history feature reads
only codes strictly before the example, the last N within M days, pooled by mean and target attention."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gem.config import load_config
from gem.data.batch import Jagged
from gem.model.build import build_task
from gem.model.configs import HistoryCodeFeatureConfig, HistoryCodesConfig
from gem.model.history_code_autoencoder import HistoryCodeAutoencoder
from gem.model.history_code_feature import HistoryCodeFeature, past_code_positions
from gem.model.ops.int4 import dequantize_int4, int4_codes, pack_int4, quantize_int4, unpack_int4
from tests.support import DAY_US, TINY_SPARSE, TINY_TASKS, tiny_batch, tiny_model_config


def test_int4_codes_round_8z_and_clamp_to_minus_8_7():
    z = torch.tensor([-1.0, -0.99, -0.5, -0.0625, 0.0625, 0.1, 0.5, 0.93, 0.99, 1.0])
    assert int4_codes(z).tolist() == [-8, -8, -4, 0, 0, 1, 4, 7, 7, 7]  # 8 * 0.0625 = 0.5 rounds to even
    assert int4_codes(z).dtype == torch.int8
    z = torch.linspace(-1, 1, 101, requires_grad=True)
    q = quantize_int4(z)
    torch.testing.assert_close(q, dequantize_int4(int4_codes(z)), rtol=0, atol=0)
    (q * torch.arange(101.0)).sum().backward()  # straight-through: dq/dz = 1
    torch.testing.assert_close(z.grad, torch.arange(101.0))


def test_pack_unpack_round_trips_exactly_two_codes_per_byte():
    every_pair = torch.cartesian_prod(torch.arange(-8, 8), torch.arange(-8, 8)).to(torch.int8)  # (256, 2)
    packed = pack_int4(every_pair)
    assert packed.shape == (256, 1) and packed.dtype == torch.uint8
    assert sorted(packed.flatten().tolist()) == list(range(256))  # every byte value once: no collisions
    assert torch.equal(unpack_int4(packed), every_pair)
    codes = torch.randint(-8, 8, (37, 32), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    assert pack_int4(codes).shape == (37, 16)
    assert torch.equal(unpack_int4(pack_int4(codes)), codes)
    assert pack_int4(torch.tensor([[-8, 7]], dtype=torch.int8)).item() == 0 | (15 << 4)  # low nibble first
    with pytest.raises(ValueError, match="even"):
        pack_int4(torch.zeros(2, 3, dtype=torch.int8))
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        pack_int4(torch.tensor([[8, 0]]))


def test_config_validates_and_loads():
    with pytest.raises(ValueError, match="code_dim\n  Input should be a multiple of 2"):
        HistoryCodesConfig(code_dim=7, prefix_lengths=(7,))
    with pytest.raises(ValueError, match="prefix_lengths"):
        HistoryCodesConfig(code_dim=16, prefix_lengths=(8, 12))  # must end at code_dim
    with pytest.raises(ValueError, match="prefix_lengths"):
        HistoryCodesConfig(code_dim=16, prefix_lengths=(16, 8))
    cfg = load_config(environ={"GEM__MODEL__HISTORY_CODES__ENABLED": "true",
                               "GEM__MODEL__HISTORY_CODES__CODE_DIM": "16",
                               "GEM__MODEL__HISTORY_CODES__PREFIX_LENGTHS": "[4, 16]"})
    assert cfg.model.history_codes == HistoryCodesConfig(enabled=True, code_dim=16, prefix_lengths=(4, 16))
    assert cfg.model.history_codes.bytes_per_event == 8


def _low_rank_activations(n: int, dim: int, seed: int) -> torch.Tensor:
    """(n, dim) activations on 12 directions of decreasing scale: what a code of 4 to 16 dims can
    capture more or less of."""
    directions = torch.randn(12, dim, generator=torch.Generator().manual_seed(100))  # the same for every seed
    scales = torch.logspace(0, -1.5, 12)
    return (torch.randn(n, 12, generator=torch.Generator().manual_seed(seed)) * scales) @ directions


def test_autoencoder_learns_a_matryoshka_code():
    torch.manual_seed(0)
    ae = HistoryCodeAutoencoder(48, HistoryCodesConfig(code_dim=16, prefix_lengths=(4, 8, 16), hidden=64))
    train, held_out = _low_rank_activations(256, 48, 0), _low_rank_activations(256, 48, 1)
    opt = torch.optim.Adam(ae.parameters(), lr=3e-3)
    with torch.no_grad():
        first = float(ae.loss(held_out))
    for _ in range(200):
        opt.zero_grad()
        ae.loss(train).backward()
        opt.step()
    with torch.no_grad():
        errors = {n: float(e) for n, e in ae.reconstruction_errors(held_out).items()}
        assert float(ae.loss(held_out)) < 0.5 * first, (first, errors)
        assert errors[4] > errors[8] > errors[16], errors  # each longer prefix reconstructs better
        assert errors[16] < 0.25, errors  # of a unit-variance target
        codes = ae.codes(held_out)
    assert codes.dtype == torch.int8 and int(codes.min()) >= -8 and int(codes.max()) <= 7
    torch.testing.assert_close(ae.encode(held_out), dequantize_int4(codes), rtol=0, atol=0)  # stored == trained
    assert len(torch.unique(codes)) > 8  # the 16 levels are used, not collapsed


def test_training_the_autoencoder_leaves_the_foundation_models_gradients_unchanged():
    """The same FM with and without the autoencoder: equal loss, logits and, exactly, every FM
    parameter's gradient; the autoencoder's own parameters all learn."""
    runs = {}
    for enabled in (False, True):
        cfg = tiny_model_config("kunlun")
        cfg = dataclasses.replace(cfg, history_codes=HistoryCodesConfig(enabled=enabled, code_dim=8,
                                                                         prefix_lengths=(2, 8), hidden=16))
        torch.manual_seed(0)
        task = build_task(cfg, TINY_TASKS, TINY_SPARSE, dense_dim=6)
        with torch.no_grad():  # towers off zero, so the FM's gradient reaches its body
            task.heads.towers.normal_(generator=torch.Generator().manual_seed(3))
        loss, logits = task(tiny_batch(b=12, seed=4))
        loss.backward()
        runs[enabled] = (task, loss.detach(), logits.detach(),
                         {n: p.grad.clone() for n, p in task.named_parameters() if p.grad is not None})
    (plain, loss0, logits0, grads0), (coded, loss1, logits1, grads1) = runs[False], runs[True]
    assert plain.history_autoencoder is None and "history_autoencoder" not in dict(plain.named_children())
    torch.testing.assert_close(loss1, loss0, rtol=0, atol=0)  # the value the trainer logs: the FM's
    torch.testing.assert_close(logits1, logits0, rtol=0, atol=0)
    fm_grads = {n: g for n, g in grads1.items() if not n.startswith("history_autoencoder.")}
    assert fm_grads.keys() == grads0.keys() and any(".body." in f".{n}" for n in fm_grads)
    for name, grad in grads0.items():
        torch.testing.assert_close(fm_grads[name], grad, rtol=0, atol=0, msg=name)
    ae_params = dict(coded.history_autoencoder.named_parameters())
    assert all(ae_params[n].grad is not None and ae_params[n].grad.abs().sum() > 0 for n in ae_params), ae_params
    assert coded.last_reconstruction_loss is not None and float(coded.last_reconstruction_loss) > 0
    assert any(n.startswith("history_autoencoder.") for n in coded.state_dict())  # checkpointed with the FM


def _reference_positions(times: list[int], offsets: list[int], example_times: list[int], max_codes: int,
                         max_age: int) -> tuple[list[int], list[int]]:
    """past_code_positions, example by example."""
    index, out_offsets = [], [0]
    for i, t in enumerate(example_times):
        eligible = [j for j in range(offsets[i], offsets[i + 1]) if 0 < t - times[j] <= max_age]
        index += eligible[len(eligible) - min(len(eligible), max_codes):]
        out_offsets.append(len(index))
    return index, out_offsets


def test_past_code_positions_match_an_example_by_example_loop():
    assert [x.tolist() for x in past_code_positions(torch.tensor([1, 5, 9, 12]), torch.tensor([0, 4]),
                                                    torch.tensor([9]), 5, 6)] == [[1], [0, 1]]  # the docstring's
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 9, (20,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    times = torch.cat([torch.sort(torch.randint(0, 100, (int(n),), generator=g)).values for n in lengths])
    example_times = torch.randint(0, 100, (20,), generator=g)
    for max_codes, max_age in ((3, 40), (100, 1000), (1, 5)):
        index, kept = past_code_positions(times, offsets, example_times, max_codes, max_age)
        ref_index, ref_kept = _reference_positions(times.tolist(), offsets.tolist(), example_times.tolist(),
                                                   max_codes, max_age)
        assert (index.tolist(), kept.tolist()) == (ref_index, ref_kept)


def _history(times_before_s: list[list[float]], example_times: torch.Tensor, code_dim: int, seed: int = 0) -> Jagged:
    """Each example's events at example time - s (negative s: after the example), oldest first."""
    g = torch.Generator().manual_seed(seed)
    times = torch.cat([example_times[i] - (torch.tensor(s, dtype=torch.float64) * 1e6).long()
                       for i, s in enumerate(times_before_s)])
    lengths = torch.tensor([len(s) for s in times_before_s])
    codes = torch.randint(-8, 8, (int(lengths.sum()), code_dim), dtype=torch.int8, generator=g)
    return Jagged({"codes": pack_int4(codes), "time_us": times},
                  torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]))


def _recode(history: Jagged, positions: list[int], seed: int) -> Jagged:
    """The history with the codes at `positions` replaced by other random codes."""
    codes = unpack_int4(history.values["codes"])
    g = torch.Generator().manual_seed(seed)
    codes[positions] = torch.randint(-8, 8, (len(positions), codes.shape[1]), dtype=torch.int8, generator=g)
    return Jagged({**history.values, "codes": pack_int4(codes)}, history.offsets)


def test_codes_at_or_after_the_example_or_too_old_or_beyond_the_last_n_never_change_the_feature():
    torch.manual_seed(0)
    cfg = HistoryCodeFeatureConfig(max_codes=3, max_age_days=2.0)
    feature = HistoryCodeFeature(8, 16, cfg).double()
    example_times = torch.tensor([50 * DAY_US, 50 * DAY_US + 7])
    day = 86_400.0
    # Example 0: too old (3 days), beyond the last 3 (1.5 days), three read (1 day, 1 hour, 1 us), then
    # at the example's time (0) and after it (-1 us, -1 hour). Example 1: only events at or after it.
    history = _history([[3 * day, 1.5 * day, day, 3600.0, 1e-6, 0.0, -1e-6, -3600.0], [0.0, -5.0]], example_times, 8)
    target = torch.randn(2, 16, dtype=torch.float64)
    mean, attended = feature(history, example_times, target)
    for ignored in ([0], [1], [5], [6, 7], [8, 9]):  # too old, beyond N, at t, after t, example 1's
        other_mean, other_attended = feature(_recode(history, ignored, seed=9), example_times, target)
        torch.testing.assert_close(other_mean, mean, rtol=0, atol=0, msg=str(ignored))
        torch.testing.assert_close(other_attended, attended, rtol=0, atol=0, msg=str(ignored))
    for read in ([2], [3], [4]):  # each of the three kept events matters, to both poolings
        other_mean, other_attended = feature(_recode(history, read, seed=9), example_times, target)
        assert not torch.allclose(other_mean[0], mean[0]) and not torch.allclose(other_attended[0], attended[0])
    assert torch.equal(mean[1], torch.zeros(16, dtype=torch.float64))  # nothing before it: both 0
    assert torch.equal(attended[1], torch.zeros(16, dtype=torch.float64))


def test_feature_pools_by_mean_and_by_target_attention():
    torch.manual_seed(0)
    feature = HistoryCodeFeature(8, 16, HistoryCodeFeatureConfig(max_codes=10, max_age_days=30.0)).double()
    example_times = torch.tensor([40 * DAY_US])
    history = _history([[5 * 86_400.0, 3600.0, 60.0]], example_times, 8)
    target = torch.randn(1, 16, dtype=torch.float64)
    mean, attended = feature(history, example_times, target)
    tokens, offsets = feature.tokens(history, example_times)  # (3, 16)
    assert offsets.tolist() == [0, 3]
    torch.testing.assert_close(mean[0], tokens.mean(0))
    weights = torch.softmax(feature.key(tokens) @ feature.query(target[0]) / 4.0, dim=0)  # (3,), 1 / sqrt(16)
    torch.testing.assert_close(attended[0], weights @ feature.value(tokens))
    other_target = feature(history, example_times, -target)[1]  # the candidate ad steers the attention only
    assert not torch.allclose(other_target, attended)
    torch.testing.assert_close(feature(history, example_times, -target)[0], mean)
