"""The per-surface student: the gradient-scaling op matches its reference; the distillation head's
gradient reaches the shared body scaled by exactly beta while the serving head learns from the true
labels only; the adapter starts as the FM and fits the labels without touching the student; the loss
terms are the ExFM formulas; every variant trains; labels only the past codes predict are learned
through them; where the FM knows more than a few labels tell, the KD student beats the baseline; the serving logits read no code at or after the example and no FM prediction;
evaluation runs the student as any train task."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from gem.config import load_config
from gem.data.batch import Jagged, Sparse
from gem.model.configs import STUDENT_VARIANTS, DistillationConfig, StudentConfig
from gem.model.history_code_feature import MICROSECONDS_PER_DAY, past_code_positions
from gem.model.ops.grad_scale import scale_gradient, scale_gradient_reference
from gem.model.ops.int4 import pack_int4, unpack_int4
from gem.model.student import StudentTask, build_student
from gem.model.task import masked_weighted_bce
from gem.train.evaluate import evaluate
from tests.support import STUDENT_TASKS, TINY_SPARSE, student_batch

CODE_DIM = 8


def _student(variant: str, seed: int = 0, **distillation) -> StudentTask:
    torch.manual_seed(seed)
    cfg = StudentConfig(variant=variant, distillation=DistillationConfig(**distillation))
    return build_student(cfg, STUDENT_TASKS, TINY_SPARSE, dense_dim=6, code_dim=CODE_DIM)


def _random_towers(task: StudentTask) -> None:
    """Heads start with zero towers (no gradient into the body at step 0); tests of the body's
    gradient give them values."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for heads in (task.heads, task.distill_heads):
            if heads is not None:
                heads.towers.normal_(generator=g)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0, 2.5])
def test_scale_gradient_matches_its_reference(beta):
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(4, 3, dtype=torch.float64)
    y, y_ref = scale_gradient(x, beta), scale_gradient_reference(x, beta)
    torch.testing.assert_close(y, x, rtol=0, atol=0)
    torch.testing.assert_close(y_ref, x)
    (grad,) = torch.autograd.grad(y, x, upstream)
    (grad_ref,) = torch.autograd.grad(y_ref, x, upstream)
    torch.testing.assert_close(grad, beta * upstream, rtol=0, atol=0)
    torch.testing.assert_close(grad_ref, grad)


def _grads(task: StudentTask, loss: torch.Tensor, prefix: str) -> dict[str, torch.Tensor]:
    params = {n: p for n, p in task.named_parameters() if n.startswith(prefix)}
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True, retain_graph=True)
    return {n: torch.zeros_like(p) if g is None else g for (n, p), g in zip(params.items(), grads, strict=True)}


def test_distillation_reaches_the_body_scaled_by_beta_and_its_head_in_full():
    """Checked on the body's parameters: grad(total) - grad(serving) = beta * grad(distillation
    terms at beta 1); the distillation head's own gradient does not depend on beta; the serving head
    gets no gradient from distillation."""
    batch = student_batch(b=24, seed=1, code_dim=CODE_DIM)
    by_beta = {}
    for beta in (1.0, 0.25, 0.0):
        task = _student("kd_adapter", beta=beta)
        _random_towers(task)
        terms, _ = task.loss_terms(batch)
        distill = sum(v for k, v in terms.items() if k != "serving")
        by_beta[beta] = {part: {prefix: _grads(task, loss, prefix) for prefix in ("body.", "distill_heads.", "heads.")}
                         for part, loss in (("serving", terms["serving"]), ("distill", distill))}
    full_body = by_beta[1.0]["distill"]["body."]
    assert sum(float(g.abs().sum()) for g in full_body.values()) > 0  # the distillation head does reach the body
    for beta in (0.25, 0.0):
        for name, grad in by_beta[beta]["distill"]["body."].items():
            torch.testing.assert_close(grad, beta * full_body[name], msg=name)
        for name, grad in by_beta[beta]["distill"]["distill_heads."].items():
            torch.testing.assert_close(grad, by_beta[1.0]["distill"]["distill_heads."][name], msg=name)
        for name, grad in by_beta[beta]["serving"]["body."].items():  # the labels' gradient is never scaled
            torch.testing.assert_close(grad, by_beta[1.0]["serving"]["body."][name], msg=name)
    assert all(float(g.abs().sum()) == 0 for g in by_beta[1.0]["distill"]["heads."].values())
    assert all(float(g.abs().sum()) == 0 for g in by_beta[1.0]["serving"]["distill_heads."].values())


def test_distillation_terms_are_the_exfm_formulas():
    task = _student("kd_adapter", alpha=0.8, weight=0.5, adapter_weight=2.0)
    _random_towers(task)
    batch = student_batch(b=20, seed=2, code_dim=CODE_DIM)
    terms, logits = task.loss_terms(batch)
    h = task.representation(batch)
    distill_logits = task.distill_heads(h)
    adapter_logits = task.adapter(batch.fm_predictions, batch.fm_prediction_mask)
    pairs = (batch.label_mask & batch.fm_prediction_mask).float() * batch.weights  # (B, T)

    def weighted_bce(logit: torch.Tensor, target: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        per_task = (F.binary_cross_entropy_with_logits(logit, target, reduction="none") * w).sum(0) / w.sum(0)
        return per_task.sum()  # task weights 1

    torch.testing.assert_close(terms["serving"], weighted_bce(logits, batch.labels,
                                                               batch.label_mask.float() * batch.weights))
    torch.testing.assert_close(terms["distill_fm"], 0.5 * weighted_bce(distill_logits, 0.8 * batch.fm_predictions, pairs))
    torch.testing.assert_close(terms["adapter"], weighted_bce(adapter_logits, batch.labels, pairs))
    torch.testing.assert_close(terms["distill_adapter"],
                               2.0 * weighted_bce(distill_logits, torch.sigmoid(adapter_logits), pairs))
    assert sorted(terms) == ["adapter", "distill_adapter", "distill_fm", "serving"]
    loss, _ = task(batch)
    torch.testing.assert_close(loss, sum(terms.values()))


def test_the_adapter_starts_as_the_fm_and_learns_the_labels_alone():
    task = _student("kd_adapter")
    _random_towers(task)
    batch = student_batch(b=32, seed=3, code_dim=CODE_DIM)
    fm, fm_mask = batch.fm_predictions, batch.fm_prediction_mask
    with torch.no_grad():
        start = torch.sigmoid(task.adapter(fm, fm_mask))
    torch.testing.assert_close(start[fm_mask], fm[fm_mask].float())
    terms, _ = task.loss_terms(batch)
    # Its parameters learn from its fit to the labels only (the second target is stop-gradient) ...
    assert all(float(g.abs().sum()) == 0 for g in _grads(task, terms["distill_adapter"], "adapter.").values())
    assert any(float(g.abs().sum()) > 0 for g in _grads(task, terms["adapter"], "adapter.").values())
    # ... and that fit never reaches the student.
    for prefix in ("body.", "embeddings.", "heads.", "distill_heads."):
        assert all(float(g.abs().sum()) == 0 for g in _grads(task, terms["adapter"], prefix).values()), prefix
    # A stale FM (its predictions squeezed towards 0.5): the adapter's fit to the labels corrects it.
    stale = dataclasses.replace(batch, fm_predictions=0.5 + 0.3 * (fm - 0.5))
    opt = torch.optim.Adam(task.adapter.parameters(), lr=1e-2)
    first = float(task.loss_terms(stale)[0]["adapter"].detach())
    for _ in range(60):
        opt.zero_grad()
        task.loss_terms(stale)[0]["adapter"].backward()
        opt.step()
    assert float(task.loss_terms(stale)[0]["adapter"].detach()) < 0.7 * first


def _excess(task: StudentTask, batch) -> dict[str, float]:
    """Each loss term above the least it can be: "serving" and "adapter" (true labels: their loss),
    and "distillation", the distillation head's terms together above their minimum. That minimum is
    at the weighted mean of the head's targets q* = sum_i w_i t_i / sum_i w_i (alpha * y_FM, and
    the adapter's output), where it is sum_i w_i BCE(logit(q*), t_i)."""
    with torch.no_grad():
        terms, _ = task.loss_terms(batch)
        out = {k: float(v) for k, v in terms.items() if not k.startswith("distill_")}
        if task.distill_heads is None:
            return out
        cfg = task.cfg.distillation
        targets = [(cfg.weight, cfg.alpha * batch.fm_predictions)]
        if task.adapter is not None:
            adapted = torch.sigmoid(task.adapter(batch.fm_predictions, batch.fm_prediction_mask))
            targets.append((cfg.adapter_weight, adapted))
        best = sum(w * t for w, t in targets) / sum(w for w, _ in targets)  # (B, T)
        pairs = batch.label_mask & batch.fm_prediction_mask
        floor = sum(w * masked_weighted_bce(torch.logit(best), t, pairs, batch.weights, task.task_weights)
                    for w, t in targets)
        out["distillation"] = float(sum(v for k, v in terms.items() if k.startswith("distill_")) - floor)
        return out


def _train(task: StudentTask, batches: list, steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """Adam steps over the batches; -> _excess, mean over the batches, before and after."""
    opt = torch.optim.Adam(task.parameters(), lr=3e-3)

    def mean_excess() -> dict[str, float]:
        per_batch = [_excess(task, b) for b in batches]
        return {k: sum(e[k] for e in per_batch) / len(batches) for k in per_batch[0]}

    first = mean_excess()
    for step in range(steps):
        opt.zero_grad()
        task(batches[step % len(batches)])[0].backward()
        opt.step()
    return first, mean_excess()


@pytest.mark.parametrize("variant", STUDENT_VARIANTS)
def test_each_variant_trains(variant):
    task = _student(variant)
    components = {"distill_heads": "aux_head", "adapter": "adapter", "history_codes": "history_codes"}
    for module, signal in components.items():
        assert (getattr(task, module) is not None) == (signal in STUDENT_VARIANTS[variant]), module
    batches = [student_batch(b=32, seed=s, code_dim=CODE_DIM) for s in (10, 11)]
    first, last = _train(task, batches, steps=40)
    expected = {"serving"} | ({"distillation"} if task.distill_heads is not None else set()) | (
        {"adapter"} if task.adapter is not None else set())
    assert set(first) == expected
    for term in expected:
        assert last[term] < 0.7 * first[term], (variant, term, first, last)


def _held_out_serving_loss(task: StudentTask, train: list, held_out, steps: int) -> float:
    """Adam steps over the train batches in turn; -> the serving head's loss on held_out."""
    opt = torch.optim.Adam(task.parameters(), lr=3e-3)
    for step in range(steps):
        opt.zero_grad()
        task(train[step % len(train)])[0].backward()
        opt.step()
    with torch.no_grad():
        return float(task.loss_terms(held_out)[0]["serving"])


def _labels_from_past_codes(batch):
    """The batch with nothing to learn from but its history codes: constant ids, zero counters, no
    sequences, an FM prediction of 0.3 everywhere; both labels = [mean first code of the example's
    readable past events > 0] (those past_code_positions keeps under the default feature config)."""
    cfg = StudentConfig().history_codes
    history = batch.fm_history_codes
    index, offsets = past_code_positions(history.values["time_us"], history.offsets, batch.impression_times,
                                         cfg.max_codes, int(cfg.max_age_days * MICROSECONDS_PER_DAY))
    lengths = offsets[1:] - offsets[:-1]
    row = torch.repeat_interleave(torch.arange(batch.size), lengths)  # (M,)
    first = unpack_int4(history.values["codes"][index])[:, 0].double()  # (M,)
    mean = torch.zeros(batch.size, dtype=torch.float64).index_add_(0, row, first) / lengths.clamp(min=1)
    labels = (mean > 0).float()[:, None].expand(-1, 2).contiguous()  # (B, 2)
    no_events = {e: Jagged({k: v[:0] for k, v in j.values.items()}, torch.zeros(batch.size + 1, dtype=torch.long))
                 for e, j in batch.sequences.items()}
    return dataclasses.replace(batch, labels=labels, fm_predictions=torch.full_like(labels, 0.3),
                               dense=torch.zeros_like(batch.dense), sequences=no_events,
                               sparse={f: Sparse(torch.zeros_like(v.values), v.lengths) for f, v in batch.sparse.items()})


def test_history_codes_carry_to_the_serving_head_what_nothing_else_does():
    """Labels that only the user's past codes predict: the LoopFM student learns them (held-out
    serving loss well under the base rate's), the same student without codes stays at the base rate."""
    train = [_labels_from_past_codes(student_batch(b=64, seed=s, code_dim=CODE_DIM, max_codes=8)) for s in range(4)]
    held_out = _labels_from_past_codes(student_batch(b=128, seed=99, code_dim=CODE_DIM, max_codes=8))
    rate = float(held_out.labels[:, 0].mean())
    assert 0.15 < rate < 0.85
    base_rate_loss = 2 * -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))  # two tasks
    held_out_loss = {v: _held_out_serving_loss(_student(v), train, held_out, steps=60) for v in ("kd", "kd_loopfm")}
    assert held_out_loss["kd"] > 0.95 * base_rate_loss, (held_out_loss, base_rate_loss)
    assert held_out_loss["kd_loopfm"] < 0.85 * base_rate_loss, (held_out_loss, base_rate_loss)


def _fm_knows(b: int, seed: int, p_by_ad: torch.Tensor):
    """A batch where the FM knows what the student could only estimate from few labels: each example's
    ad (one of len(p_by_ad)) sets p, both labels ~ Bernoulli(p), the FM's prediction is p itself;
    nothing else informative (constant ids, zero counters, no sequences)."""
    g = torch.Generator().manual_seed(seed)
    batch = student_batch(b=b, seed=seed, code_dim=CODE_DIM)
    ads = torch.randint(0, len(p_by_ad), (b,), generator=g)
    p = p_by_ad[ads][:, None].expand(-1, 2).contiguous()  # (B, 2)
    no_events = {e: Jagged({k: v[:0] for k, v in j.values.items()}, torch.zeros(b + 1, dtype=torch.long))
                 for e, j in batch.sequences.items()}
    sparse = {f: Sparse(torch.zeros_like(v.values), v.lengths) for f, v in batch.sparse.items()}
    sparse["ad_id"] = Sparse(ads, torch.ones(b, dtype=torch.int32))
    return dataclasses.replace(batch, labels=(torch.rand(b, 2, generator=g) < p).float(), weights=torch.ones(b, 2),
                               fm_predictions=p.clone(), fm_prediction_mask=torch.ones(b, 2, dtype=torch.bool),
                               dense=torch.zeros_like(batch.dense), sequences=no_events, sparse=sparse)


def test_the_kd_student_beats_the_baseline_where_the_fm_knows_more():
    """128 labelled examples over 16 ads whose click rates the FM knows: the KD student (the FM's
    predictions as the distillation head's target, shaping the shared body) scores a lower held-out
    serving loss than the same student trained on the labels alone, on each of 3 seeds, by more than 0.02:
    on 128 labels alone the student stays well above the labels' own Bayes loss, and the FM's
    predictions close more of that gap than the margin on every seed."""
    for seed in range(3):
        p_by_ad = 0.02 + 0.6 * torch.rand(16, generator=torch.Generator().manual_seed(100 + seed))
        train = [_fm_knows(64, 10 * seed + i, p_by_ad) for i in range(2)]
        held_out = _fm_knows(4096, 999 + seed, p_by_ad)
        loss = {v: _held_out_serving_loss(_student(v, seed=seed), train, held_out, steps=80) for v in ("baseline", "kd")}
        assert loss["kd"] < loss["baseline"] - 0.02, (seed, loss)


def test_serving_logits_read_no_fm_prediction_and_no_code_at_or_after_the_example():
    task = _student("kd_adapter_loopfm").eval()
    _random_towers(task)
    batch = student_batch(b=16, seed=4, code_dim=CODE_DIM)
    with torch.no_grad():
        logits = task.logits(batch)
        assert torch.equal(task.logits(dataclasses.replace(batch, fm_predictions=1 - batch.fm_predictions)), logits)
        codes = batch.fm_history_codes
        lengths = codes.offsets[1:] - codes.offsets[:-1]
        row = torch.repeat_interleave(torch.arange(16), lengths)
        later = codes.values["time_us"] >= batch.impression_times[row]
        assert 0 < int(later.sum()) < later.numel()  # the batch has both kinds
        unpacked = unpack_int4(codes.values["codes"])
        flipped = torch.where(later[:, None], -1 - unpacked, unpacked)  # another code wherever it is late
        moved = Jagged({**codes.values, "codes": pack_int4(flipped)}, codes.offsets)
        assert torch.equal(task.logits(dataclasses.replace(batch, fm_history_codes=moved)), logits)
        earlier = torch.where(~later[:, None], -1 - unpacked, unpacked)  # an earlier code does matter
        moved = Jagged({**codes.values, "codes": pack_int4(earlier)}, codes.offsets)
        assert not torch.allclose(task.logits(dataclasses.replace(batch, fm_history_codes=moved)), logits)


def test_students_are_built_validated_and_configured():
    with pytest.raises(ValueError, match="one surface"):
        build_student(StudentConfig(), ("reels/click", "fb_feed/click"), TINY_SPARSE, 6, CODE_DIM)
    with pytest.raises(ValueError, match="variant"):
        StudentConfig(variant="distilled")
    with pytest.raises(ValueError, match="alpha"):
        DistillationConfig(alpha=1.5)
    with pytest.raises(ValueError, match="fm_predictions"):
        _student("kd")(dataclasses.replace(student_batch(code_dim=CODE_DIM), fm_predictions=None))
    with pytest.raises(ValueError, match="fm_history_codes"):
        _student("kd_loopfm")(dataclasses.replace(student_batch(code_dim=CODE_DIM), fm_history_codes=None))
    baseline = _student("baseline")
    baseline(dataclasses.replace(student_batch(code_dim=CODE_DIM), fm_predictions=None, fm_history_codes=None))
    cfg = load_config(environ={"GEM__STUDENT__VARIANT": "kd", "GEM__STUDENT__DISTILLATION__BETA": "0.2",
                               "GEM__STUDENT__HISTORY_CODES__MAX_CODES": "50"})
    assert (cfg.student.variant, cfg.student.distillation.beta, cfg.student.history_codes.max_codes) == ("kd", 0.2, 50)
    assert cfg.student.uses("aux_head") and not cfg.student.uses("history_codes")


def test_a_student_is_evaluated_and_initialized_like_any_train_task():
    task = _student("kd_adapter_loopfm")
    task.init_from_base_rates({"reels/click": 0.1, "reels/lead": 0.01})
    batch = student_batch(b=40, seed=6, code_dim=CODE_DIM)
    with torch.no_grad():
        torch.testing.assert_close(torch.sigmoid(task.logits(batch)[:, 0]), torch.full((40,), 0.1))
        torch.testing.assert_close(torch.sigmoid(task.distill_heads(task.representation(batch))[:, 1]),
                                   torch.full((40,), 0.01))
    scores = evaluate(task, [batch])
    assert sorted(scores) == sorted(STUDENT_TASKS) and all(s["examples"] == 40 for s in scores.values())
