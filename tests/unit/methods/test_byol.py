"""BYOL against closed forms: the regression loss 2 - 2 cos on hand values, the symmetric loss against a loop,
the cosine EMA schedule and update against the paper's formulas, and a resume that keeps the target network."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from contrastive.methods import build_method
from contrastive.methods.byol import BYOL, ema_tau, regression_loss
from tests.unit.modalities.image.training import MODEL, train_on_images

BYOL_KWARGS = {"name": "byol", "temperature": 0.2, "byol": {"tau_base": 0.9, "predictor_hidden": 8}}


def test_regression_loss_is_two_minus_two_cosine_on_hand_values():
    prediction = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [3.0, 4.0]])
    target = torch.tensor([[0.0, 1.0], [2.0, 2.0], [-1.0, 0.0], [4.0, 3.0]])
    # orthogonal: 2; parallel (any length): 0; opposite: 4; cos = 24/25: 2 - 48/25
    expected = torch.tensor([2.0, 0.0, 4.0, 2.0 / 25.0])
    assert torch.allclose(regression_loss(prediction, target), expected, atol=1e-6)


def _linear_byol(tau_base=0.9):
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    head = nn.Linear(3, 3)
    predictor = nn.Linear(3, 3)
    return BYOL(backbone=backbone, head=head, predictor=predictor, tau_base=tau_base)


def test_symmetric_loss_matches_a_loop():
    method = _linear_byol()
    with torch.no_grad():  # a target that differs from the online network, as after some EMA steps
        for p in method.target_parameters():
            p.add_(0.3 * torch.randn_like(p))
    view1, view2 = torch.randn(5, 1, 2, 2), torch.randn(5, 1, 2, 2)
    loss, stats = method.training_loss(view1, view2, step=0)

    def online(x):
        return method.predictor(method.head(method.backbone(x[None])))[0].tolist()

    def target(x):
        return method.target_head(method.target_backbone(x[None]))[0].tolist()

    def two_minus_two_cos(a, b):
        dot = sum(x * y for x, y in zip(a, b))
        return 2 - 2 * dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))

    expected = np.mean([two_minus_two_cos(online(a), target(b)) + two_minus_two_cos(online(b), target(a))
                        for a, b in zip(view1, view2)])
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert stats == {"byol/tau": 0.9}
    loss.backward()
    assert all(p.grad is None for p in method.target_parameters())  # the target gets no gradient
    assert method.predictor.weight.grad is not None and method.backbone[1].weight.grad is not None


def test_cosine_schedule_rises_from_tau_base_to_one():
    assert ema_tau(tau_base=0.99, step=0, total_steps=10) == pytest.approx(0.99)
    assert ema_tau(tau_base=0.99, step=5, total_steps=10) == pytest.approx(0.995)  # cos(pi/2) = 0
    assert ema_tau(tau_base=0.99, step=10, total_steps=10) == pytest.approx(1.0)
    assert ema_tau(tau_base=0.99, step=3, total_steps=None) == 0.99  # before on_train_start


def test_ema_update_matches_the_formula():
    method = _linear_byol(tau_base=0.9)
    method.on_train_start(total_steps=4)
    with torch.no_grad():
        for p in method.online_parameters():
            p.copy_(torch.randn_like(p))
    online = [p.detach().clone() for p in method.online_parameters()]
    before = [p.detach().clone() for p in method.target_parameters()]
    method.after_optimizer_step(step=1)
    tau = 1 - (1 - 0.9) * (math.cos(math.pi * 1 / 4) + 1) / 2
    for new, old, theta in zip(method.target_parameters(), before, online):
        assert torch.allclose(new, tau * old + (1 - tau) * theta, atol=1e-6)
    assert not any(torch.equal(new, theta) for new, theta in zip(method.target_parameters(), online))


def _train(tmp_path, *, stop_after_steps=None):
    images = torch.randint(0, 255, (48, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    return train_on_images(checkpoint_dir=tmp_path / "ckpt", method_kwargs=BYOL_KWARGS, images=images,
                           stop_after_steps=stop_after_steps)


def test_resume_keeps_the_target_network(tmp_path):
    full_model, full = _train(tmp_path / "full")
    assert full.steps == 12 and np.isfinite(full.final_loss)
    _train(tmp_path / "crash", stop_after_steps=5)
    resumed_model, resumed = _train(tmp_path / "crash")
    assert resumed.resumed_from_step == 5
    full_state, resumed_state = full_model.state_dict(), resumed_model.state_dict()
    targets = [name for name in full_state if name.startswith(("target_backbone", "target_head"))]
    assert targets and full_state.keys() == resumed_state.keys()
    for name in full_state:  # the target network resumed from the checkpoint, not re-copied from the online one
        assert torch.allclose(full_state[name].float(), resumed_state[name].float(), atol=1e-5), name
    online, target = full_model.backbone.state_dict(), full_model.target_backbone.state_dict()
    assert any(not torch.allclose(online[n].float(), target[n].float()) for n in online)
    assert [h["byol/tau"] for h in resumed.history] == [h["byol/tau"] for h in full.history[5:]]


def test_builds_from_the_config_section():
    from contrastive.modalities.image.config import MethodConfig
    method = build_method(model_kwargs=MODEL, method_kwargs=MethodConfig(name="byol").model_dump(mode="json"))
    assert isinstance(method, BYOL) and not method.wants_groups and method.tau_base == 0.996
    assert method.embed(torch.rand(3, 3, 8, 8)).shape == (3, 8)  # the backbone's features (B, D)


def test_a_samples_loss_ignores_its_batch_mates_but_for_batch_norm():
    """What MCL's cluster-pure batches can change for BYOL: with batch statistics frozen (eval mode) a sample's
    loss term is the same in any batch; SimCLR's changes, because the batch mates are its negatives."""
    torch.manual_seed(0)
    byol = build_method(model_kwargs=MODEL, method_kwargs=BYOL_KWARGS).eval()
    simclr = build_method(model_kwargs=MODEL, method_kwargs={"name": "simclr", "temperature": 0.2}).eval()
    anchor1, anchor2 = torch.rand(1, 3, 8, 8), torch.rand(1, 3, 8, 8)
    batches = [torch.rand(5, 3, 8, 8), torch.rand(5, 3, 8, 8).mul(0.1)]  # two different sets of batch mates

    def byol_term(mates1, mates2):
        p = byol.predictor(byol.head(byol.backbone(torch.cat([anchor1, mates1]))))[0:1]
        z = byol.target_head(byol.target_backbone(torch.cat([anchor2, mates2])))[0:1]
        return regression_loss(p, z).item()

    def simclr_term(mates1, mates2):  # NT-Xent's term of the anchor's first view: its candidates are the batch
        z1 = torch.nn.functional.normalize(simclr(torch.cat([anchor1, mates1])), dim=1)
        z2 = torch.nn.functional.normalize(simclr(torch.cat([anchor2, mates2])), dim=1)
        candidates = torch.cat([z2, z1[1:]])  # the positive z2[0], then every other view in the batch
        logits = candidates @ z1[0] / 0.2
        return (torch.logsumexp(logits, dim=0) - logits[0]).item()

    with torch.no_grad():
        byol_terms = [byol_term(m, m.flip(-1)) for m in batches]
        simclr_losses = [simclr_term(m, m.flip(-1)) for m in batches]
    assert byol_terms[0] == pytest.approx(byol_terms[1], rel=1e-6)
    assert simclr_losses[0] != pytest.approx(simclr_losses[1], rel=1e-3)
