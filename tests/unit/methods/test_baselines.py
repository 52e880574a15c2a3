"""IFM, TS and FD against hand-written references (loops over anchors, closed forms)."""
import math

import pytest
import torch

from contrastive.errors import ConfigError
from contrastive.methods.losses import nt_xent
from contrastive.methods import build_method
from contrastive.methods.feature_dropout import FdSettings, Viewmaker, project_l1
from contrastive.methods.ifm import ifm_nt_xent
from contrastive.methods.temperature_schedule import TsSettings, scheduled_temperature

MODEL = {"encoder": "small_cnn", "widths": [4, 8], "projection_hidden": 8, "projection_dim": 4}


def ifm_reference(z1, z2, tau, eps):
    """-log(exp((s+ - eps)/tau) / (exp((s+ - eps)/tau) + sum_negatives exp((s- + eps)/tau))), anchor by anchor."""
    z = torch.nn.functional.normalize(torch.cat([z1, z2]), dim=1).double()
    n, b = z.shape[0], z1.shape[0]
    total = 0.0
    for i in range(n):
        j = (i + b) % n
        pos = math.exp((float(z[i] @ z[j]) - eps) / tau)
        neg = sum(math.exp((float(z[i] @ z[k]) + eps) / tau) for k in range(n) if k not in (i, j))
        total += -math.log(pos / (pos + neg))
    return total / n


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_ifm_loss_matches_the_anchor_by_anchor_reference(eps):
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)
    got = float(ifm_nt_xent(z1=z1, z2=z2, temperature=0.5, epsilon=eps))
    assert got == pytest.approx(ifm_reference(z1, z2, 0.5, eps), rel=1e-5)
    if eps == 0.0:
        assert got == pytest.approx(float(nt_xent(z1=z1, z2=z2, temperature=0.5)), rel=1e-6)


def test_ifm_method_averages_the_plain_and_the_perturbed_loss():
    torch.manual_seed(0)
    method = build_method(model_kwargs=MODEL, method_kwargs={"name": "ifm", "temperature": 0.5,
                                                             "ifm": {"epsilon": 0.2, "alpha": 1.0}})
    method.eval()  # BatchNorm in eval: the same projections in both computations
    v1, v2 = torch.rand(4, 3, 16, 16), torch.rand(4, 3, 16, 16)
    loss, metrics = method.training_loss(v1, v2, step=0)
    z1, z2 = method(torch.cat([v1, v2])).chunk(2)
    z1, z2 = z1.detach(), z2.detach()
    expected = (ifm_reference(z1, z2, 0.5, 0.0) + ifm_reference(z1, z2, 0.5, 0.2)) / 2
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)
    assert metrics["ifm/perturbed_loss"] > metrics["ifm/plain_loss"]  # the margin makes the task harder


def test_temperature_schedule_closed_form():
    s = TsSettings(tau_min=0.1, tau_max=1.0, cycles=1.0)
    assert scheduled_temperature(step=0, total_steps=100, settings=s) == pytest.approx(1.0)
    assert scheduled_temperature(step=50, total_steps=100, settings=s) == pytest.approx(0.1)
    assert scheduled_temperature(step=25, total_steps=100, settings=s) == pytest.approx(0.55)
    assert scheduled_temperature(step=100, total_steps=100, settings=s) == pytest.approx(1.0)
    two = TsSettings(tau_min=0.2, tau_max=0.6, cycles=2.0)
    assert scheduled_temperature(step=25, total_steps=100, settings=two) == pytest.approx(0.2)
    with pytest.raises(ConfigError, match="tau_min <= tau_max"):
        TsSettings(tau_min=0.5, tau_max=0.1)


def test_ts_method_uses_the_scheduled_temperature():
    torch.manual_seed(0)
    method = build_method(model_kwargs=MODEL, method_kwargs={"name": "ts", "temperature": 0.2,
                                                             "ts": {"tau_min": 0.1, "tau_max": 1.0}})
    method.on_train_start(total_steps=10)
    method.eval()
    v1, v2 = torch.rand(4, 3, 16, 16), torch.rand(4, 3, 16, 16)
    loss, metrics = method.training_loss(v1, v2, step=5)
    z1, z2 = method(torch.cat([v1, v2])).chunk(2)
    assert metrics["ts/temperature"] == pytest.approx(0.1)
    assert float(loss.detach()) == pytest.approx(ifm_reference(z1.detach(), z2.detach(), 0.1, 0.0), rel=1e-5)


def test_l1_projection_meets_the_budget_exactly():
    delta = torch.randn(3, 4, 8, 8)
    projected = project_l1(delta, budget=0.05)
    assert torch.allclose(projected.abs().mean(dim=(1, 2, 3)), torch.full((3,), 0.05), atol=1e-5)
    assert torch.equal(torch.sign(projected), torch.sign(delta))


def test_viewmaker_stays_in_budget_and_its_gradient_ascends_the_loss():
    torch.manual_seed(0)
    maker = Viewmaker(channels=4, settings=FdSettings(budget=0.05, width=8, blocks=1))
    x = torch.rand(2, 4, 16, 16) * 0.8 + 0.1  # far from the clamp at 0 and 1
    out = maker(x)
    assert (out - x).abs().mean(dim=(1, 2, 3)).tolist() == pytest.approx([0.05, 0.05], abs=1e-4)
    # Gradient reversal: the viewmaker's parameters get -dL/dtheta. Reference: the same forward without reversal.
    target = torch.rand_like(x)
    torch.manual_seed(1)
    loss = ((maker(x) - target) ** 2).sum()
    loss.backward()
    reversed_grad = maker.out.weight.grad.clone()
    maker.zero_grad()
    torch.manual_seed(1)
    plain = ((x + maker.perturbation(x)).clamp(0, 1) - target).pow(2).sum()
    plain.backward()
    assert torch.allclose(reversed_grad, -maker.out.weight.grad, atol=1e-6)


def test_fd_method_trains_encoder_down_and_viewmaker_up():
    torch.manual_seed(0)
    method = build_method(model_kwargs={**MODEL, "in_channels": 4},
                          method_kwargs={"name": "fd", "temperature": 0.5, "fd": {"budget": 0.1, "width": 8}})
    v1, v2 = torch.rand(4, 4, 16, 16), torch.rand(4, 4, 16, 16)
    loss, metrics = method.training_loss(v1, v2, step=0)
    loss.backward()
    assert 0 < metrics["fd/view_change"] <= 0.1 + 1e-4
    assert method.viewmaker.out.weight.grad is not None and method.backbone is not None
    assert method.embed(v1).shape[0] == 4  # the exported representation is the backbone's, without the viewmaker


def test_baselines_refuse_hex():
    with pytest.raises(ConfigError, match="hex"):
        build_method(model_kwargs=MODEL, method_kwargs={"name": "ifm", "temperature": 0.5, "hex": {"enabled": True}})
