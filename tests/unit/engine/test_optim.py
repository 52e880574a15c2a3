"""contrastive/engine/optim.py against hand-written updates and closed forms: LARS (trust ratio, exclusion,
momentum, state round-trip), the warmup + cosine multiplier, the batch-size scaling rules, the no-decay groups."""
import io
import math

import pytest
import torch
from torch import nn

from contrastive.engine.optim import LARS, build_optimizer, lr_multiplier, param_groups, scaled_lr


def _lars_reference(w, grads, *, lr, momentum, weight_decay, eta, adapt):
    """LARS on one tensor, written out from the paper: v <- m v + lr * trust * (g + wd w); w <- w - v, with
    trust = eta ||w|| / (||g|| + wd ||w||); an excluded tensor: v <- m v + lr g."""
    w = w.clone().double()
    v = torch.zeros_like(w)
    for g in grads:
        g = g.double()
        if adapt:
            w_norm, g_norm = w.norm().item(), g.norm().item()
            trust = eta * w_norm / (g_norm + weight_decay * w_norm) if w_norm > 0 and g_norm > 0 else 1.0
            d = trust * (g + weight_decay * w)
        else:
            d = g
        v = momentum * v + lr * d
        w = w - v
    return w


def _run_lars(w0, grads, *, named: bool, **options):
    param = nn.Parameter(w0.clone())
    opt = LARS([("layer.weight", param)] if named else [param], **options)
    for g in grads:
        param.grad = g.clone()
        opt.step()
    return param.detach()


OPTIONS = {"lr": 0.5, "momentum": 0.9, "weight_decay": 1e-2, "eta": 1e-3}


@pytest.mark.parametrize("steps", [1, 3])
def test_lars_matches_the_hand_written_update(steps):
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    grads = [torch.randn(4, 5, generator=gen, dtype=torch.float64) for _ in range(steps)]
    expected = _lars_reference(w0, grads, adapt=True, **OPTIONS)
    torch.testing.assert_close(_run_lars(w0, grads, named=False, **OPTIONS), expected, rtol=1e-12, atol=1e-14)
    # One step by hand with numbers: trust = eta * ||w|| / (||g|| + wd ||w||), w1 = w0 - lr * trust * (g + wd w0).
    if steps == 1:
        g = grads[0]
        trust = 1e-3 * w0.norm() / (g.norm() + 1e-2 * w0.norm())
        torch.testing.assert_close(expected, w0 - 0.5 * trust * (g + 1e-2 * w0))
    # A 2-D weight is adapted: the step differs from plain momentum SGD.
    assert not torch.allclose(expected, _lars_reference(w0, grads, adapt=False, **OPTIONS))


def test_lars_excludes_biases_and_norm_layers_from_decay_and_adaptation():
    gen = torch.Generator().manual_seed(1)
    bias, grads = torch.randn(6, generator=gen, dtype=torch.float64), [torch.randn(6, generator=gen,
                                                                                   dtype=torch.float64)]
    expected = _lars_reference(bias, grads, adapt=False, **OPTIONS)
    torch.testing.assert_close(_run_lars(bias, grads, named=False, **OPTIONS), expected)
    torch.testing.assert_close(expected, bias - 0.5 * grads[0])  # one step: plain SGD, no decay
    # By name when names are given: a 2-D parameter of a norm layer / an embedding is excluded too.
    weight, grads2 = torch.randn(3, 4, generator=gen, dtype=torch.float64), [torch.randn(3, 4, generator=gen,
                                                                                         dtype=torch.float64)]
    for name, adapted in [("encoder.pos_embedding", False), ("bn1.weight", False), ("layer1.0.conv1.weight", True)]:
        param = nn.Parameter(weight.clone())
        opt = LARS([(name, param)], **OPTIONS)
        param.grad = grads2[0].clone()
        opt.step()
        torch.testing.assert_close(param.detach(), _lars_reference(weight, grads2, adapt=adapted, **OPTIONS))
    # A custom predicate replaces the rule: exclude nothing, and a bias is adapted.
    param = nn.Parameter(bias.clone())
    opt = LARS([param], exclude=lambda name, p: False, **OPTIONS)
    param.grad = grads[0].clone()
    opt.step()
    torch.testing.assert_close(param.detach(), _lars_reference(bias, grads, adapt=True, **OPTIONS))


def test_lars_trust_ratio_is_one_for_a_zero_weight():
    grads = [torch.ones(2, 3, dtype=torch.float64)]
    out = _run_lars(torch.zeros(2, 3, dtype=torch.float64), grads, named=False, **OPTIONS)
    torch.testing.assert_close(out, -0.5 * grads[0])


def test_lars_state_dict_round_trips():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    x = torch.randn(16, 4)

    def step(m, opt):
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()

    opt = LARS(model.named_parameters(), lr=0.1, weight_decay=1e-4)
    for _ in range(2):
        step(model, opt)
    clone = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    clone.load_state_dict(model.state_dict())
    restored = LARS(clone.named_parameters(), lr=0.1, weight_decay=1e-4)
    saved = io.BytesIO()  # through bytes, as a checkpoint: load_state_dict alone would share the buffers
    torch.save(opt.state_dict(), saved)
    saved.seek(0)
    restored.load_state_dict(torch.load(saved))
    assert restored.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    assert len(restored.state) == len(list(clone.parameters()))
    step(model, opt)
    step(clone, restored)
    for a, b in zip(model.parameters(), clone.parameters()):
        assert torch.equal(a, b)


def test_build_optimizer_names_and_lars_under_a_schedule():
    model = nn.Linear(3, 2)
    for name, cls in [("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW), ("sgd", torch.optim.SGD),
                      ("lars", LARS)]:
        opt = build_optimizer(params=param_groups(model, weight_decay=1e-4), name=name, lr=0.1, weight_decay=1e-4)
        assert isinstance(opt, cls)
    with pytest.raises(ValueError, match="lars"):
        build_optimizer(params=model.parameters(), name="lamb", lr=0.1, weight_decay=0.0)
    # The engine's LambdaLR scales each group's lr, which LARS reads at every step.
    opt = build_optimizer(params=model.parameters(), name="lars", lr=0.1, weight_decay=0.0, momentum=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    before = model.bias.detach().clone()
    model.bias.grad = torch.ones(2)
    model.weight.grad = None
    opt.step()
    sched.step()
    torch.testing.assert_close(model.bias.detach(), before - 0.05)


def test_lr_multiplier_warmup_and_cosine_closed_forms():
    total, warmup = 110, 10
    for step in range(warmup):
        assert lr_multiplier(step=step, total_steps=total, warmup_steps=warmup, schedule="cosine") == \
            pytest.approx((step + 1) / warmup)
    for step in (10, 35, 60, 85, 109, 110, 200):
        progress = min(1.0, (step - warmup) / (total - warmup))
        assert lr_multiplier(step=step, total_steps=total, warmup_steps=warmup, schedule="cosine") == \
            pytest.approx(0.5 * (1 + math.cos(math.pi * progress)))
    assert lr_multiplier(step=60, total_steps=total, warmup_steps=warmup, schedule="cosine") == pytest.approx(0.5)
    assert lr_multiplier(step=110, total_steps=total, warmup_steps=warmup, schedule="cosine") == pytest.approx(0.0)
    assert lr_multiplier(step=0, total_steps=total, warmup_steps=0, schedule="cosine") == 1.0
    assert lr_multiplier(step=5, total_steps=total, warmup_steps=warmup, schedule="constant") == pytest.approx(0.6)
    assert lr_multiplier(step=50, total_steps=total, warmup_steps=warmup, schedule="constant") == 1.0


def test_scaled_lr_rules():
    assert scaled_lr(base_lr=0.3, global_batch_size=4096, rule="none") == 0.3
    assert scaled_lr(base_lr=0.3, global_batch_size=4096, rule="linear") == pytest.approx(4.8)  # SimCLR 0.3 B/256
    assert scaled_lr(base_lr=0.075, global_batch_size=4096, rule="sqrt") == pytest.approx(4.8)  # 0.075 sqrt(B)
    assert scaled_lr(base_lr=1.0, global_batch_size=256, rule="linear") == 1.0
    with pytest.raises(ValueError, match="none, linear or sqrt"):
        scaled_lr(base_lr=1.0, global_batch_size=256, rule="log")


def test_param_groups_exclusion_rule():
    class Tower(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = nn.BatchNorm2d(4)
            self.ln_post = nn.LayerNorm(4)
            self.proj = nn.Linear(4, 4, bias=False)
            self.token_embedding = nn.Embedding(10, 4)
            self.positional_embedding = nn.Parameter(torch.zeros(5, 4))
            self.class_token = nn.Parameter(torch.zeros(1, 1, 4))
            self.logit_scale = nn.Parameter(torch.tensor(1.0))
            self.frozen = nn.Linear(4, 4)
            self.frozen.requires_grad_(False)

    model = Tower()
    no_decay, decay = param_groups(model, weight_decay=0.1)
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.1
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in decay["params"]) == ["conv.weight", "proj.weight"]
    assert sorted(names[id(p)] for p in no_decay["params"]) == sorted([
        "conv.bias", "bn.weight", "bn.bias", "ln_post.weight", "ln_post.bias", "token_embedding.weight",
        "positional_embedding", "class_token", "logit_scale"])
