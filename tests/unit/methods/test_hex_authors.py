"""The HEX authors' mode (hard-negative weighting of H(i), min-max normalised threshold, per-row adaptive
percentile, warm-up) against hand-written per-row loops and closed forms; cache keys of earlier HEX configs."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from contrastive.errors import ConfigError
from contrastive.methods.hex import EpsilonRule, HexRule, HexSettings, hex_key_content, minmax_rows, row_percentiles
from contrastive.methods.losses import (HardNegativeWeighting, cross_view_info_nce, hex_info_nce, nt_xent, queue_info_nce,
                                two_view_negatives)
from contrastive.methods.simclr import SimCLR


def hard_row(pos, negatives, in_h, *, tau_plus, beta, temperature):
    """One anchor of the authors' loss, term by term (Robinson et al.'s estimate restricted to H(i))."""
    hier = [s for s, h in zip(negatives, in_h) if h]
    rest = sum((torch.exp(s) for s, h in zip(negatives, in_h) if not h), torch.tensor(0.0))
    if hier:
        m = len(hier)
        importance = [torch.exp(beta * s) for s in hier]
        mean_importance = sum(importance) / m
        estimate = (sum(w / mean_importance * torch.exp(s) for w, s in zip(importance, hier))
                    - tau_plus * m * torch.exp(pos)) / (1 - tau_plus)
        floor = m * math.exp(-1 / temperature)
        estimate = estimate if estimate.item() >= floor else torch.tensor(floor)
    else:
        estimate = torch.tensor(0.0)
    return -torch.log(torch.exp(pos) / (torch.exp(pos) + estimate + rest))


def two_view_reference(z1, z2, hierarchy, **kw):
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    n, b = len(z), len(z1)
    total = 0.0
    for i in range(n):
        j = (i + b) % n
        ks = [k for k in range(n) if k not in (i, j)]
        total = total + hard_row(z[i] @ z[j] / kw["temperature"], [z[i] @ z[k] / kw["temperature"] for k in ks],
                                 [bool(hierarchy[i, k]) for k in ks], **kw)
    return total / n


def views(batch=6, dim=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, dim, generator=gen), torch.randn(batch, dim, generator=gen)


@pytest.mark.parametrize("tau_plus,beta,temperature", [(0.1, 1.0, 0.5), (0.0, 0.5, 0.3), (0.3, 2.0, 1.0)])
def test_hard_negative_loss_and_gradient_match_a_per_row_loop(tau_plus, beta, temperature):
    z1, z2 = views(seed=1)
    hierarchy = (torch.rand(12, 12, generator=torch.Generator().manual_seed(2)) > 0.5) & two_view_negatives(6)
    hierarchy[0] = False  # a row with an empty H(i): plain InfoNCE for that anchor
    a1, a2 = z1.clone().requires_grad_(True), z2.clone().requires_grad_(True)
    loss, stats = hex_info_nce(z1=a1, z2=a2, temperature=temperature, epsilon=None,
                               q=HardNegativeWeighting(tau_plus=tau_plus, beta=beta), hierarchy_mask=hierarchy)
    loss.backward()
    r1, r2 = z1.clone().requires_grad_(True), z2.clone().requires_grad_(True)
    expected = two_view_reference(r1, r2, hierarchy, tau_plus=tau_plus, beta=beta, temperature=temperature)
    expected.backward()
    assert torch.allclose(loss, expected, atol=1e-5)
    assert torch.allclose(a1.grad, r1.grad, atol=1e-5) and torch.allclose(a2.grad, r2.grad, atol=1e-5)
    assert math.isnan(stats["hex/q_mean"]) and stats["hex/q_effective"] > 0 and 0 <= stats["hex/clamped_share"] <= 1


def test_no_prior_and_uniform_weights_is_info_nce():
    """tau+ = 0, beta = 0: w = 1 and the estimate is the plain sum over H(i) (never below its floor, since
    s >= -1/tau), so the loss is NT-Xent whatever H(i)."""
    z1, z2 = views(seed=3)
    every = two_view_negatives(6)
    loss, stats = hex_info_nce(z1=z1, z2=z2, temperature=0.2, epsilon=None,
                               q=HardNegativeWeighting(tau_plus=0.0, beta=0.0), hierarchy_mask=every)
    assert torch.allclose(loss, nt_xent(z1=z1, z2=z2, temperature=0.2), atol=1e-5)
    assert math.isclose(stats["hex/q_effective"], 1.0, rel_tol=1e-5) and stats["hex/clamped_share"] == 0.0


def test_floor_is_per_row_and_stops_the_gradient_through_h():
    """A large tau+ drives the estimate below M_i e^{-1/tau}: the term is the row's own floor (so rows with
    different |H(i)| get different terms) and no gradient flows through the hierarchy logits."""
    positive = torch.tensor([2.0, 2.0])
    negatives = torch.tensor([[0.0, 0.5, -1.0, 0.3], [0.1, -0.2, 0.4, 0.0]], requires_grad=True)
    hierarchy = torch.tensor([[True, True, False, False], [True, True, True, False]])
    w = HardNegativeWeighting(tau_plus=0.9, beta=1.0)
    per_row, stats = cross_view_rows(positive, negatives, hierarchy, w, temperature=1.0)
    for i, m in enumerate((2, 3)):
        rest = negatives[i][~hierarchy[i]].exp().sum()
        expected = -positive[i] + torch.log(positive[i].exp() + m * math.exp(-1.0) + rest)
        assert torch.allclose(per_row[i], expected, atol=1e-6)
    per_row.sum().backward()
    assert torch.equal(negatives.grad[hierarchy], torch.zeros(5)) and (negatives.grad[~hierarchy] > 0).all()
    assert stats["hex/clamped_share"] == 1.0


def cross_view_rows(positive, negatives, hierarchy, weighting, *, temperature):
    from contrastive.methods.losses import hex_terms
    return hex_terms(positive_logits=positive, negative_logits=negatives, hierarchy=hierarchy, q=weighting,
                     temperature=temperature)


def test_queue_and_cross_view_hard_losses_match_the_loop():
    gen = torch.Generator().manual_seed(4)
    query, key, queue = torch.randn(4, 3, generator=gen), torch.randn(4, 3, generator=gen), torch.randn(7, 3,
                                                                                                        generator=gen)
    hierarchy = torch.rand(4, 7, generator=gen) > 0.4
    w, t = HardNegativeWeighting(tau_plus=0.1, beta=1.0), 0.5
    qn, kn, un = (F.normalize(x, dim=1) for x in (query, key, queue))
    expected = torch.stack([hard_row(qn[i] @ kn[i] / t, [qn[i] @ un[k] / t for k in range(7)],
                                     hierarchy[i].tolist(), tau_plus=0.1, beta=1.0, temperature=t)
                            for i in range(4)]).mean()
    got = queue_info_nce(query=query, key=key, queue=queue, temperature=t, hierarchy=hierarchy, q=w)
    assert torch.allclose(got, expected, atol=1e-5)

    anchors, candidates = torch.randn(5, 3, generator=gen), torch.randn(5, 3, generator=gen)
    an, cn = F.normalize(anchors, dim=1), F.normalize(candidates, dim=1)
    hierarchy = torch.rand(5, 5, generator=gen) > 0.4
    expected = torch.stack([hard_row(an[i] @ cn[i] / t, [an[i] @ cn[k] / t for k in range(5) if k != i],
                                     [bool(hierarchy[i, k]) for k in range(5) if k != i], tau_plus=0.1, beta=1.0,
                                     temperature=t) for i in range(5)]).mean()
    got, stats = cross_view_info_nce(anchors=anchors, candidates=candidates, temperature=t, hierarchy=hierarchy,
                                     q=w, with_stats=True)
    assert torch.allclose(got, expected, atol=1e-5) and "hex/q_effective" in stats


# ---------------------------------------------------------------------------------------------------- selection
def test_minmax_threshold_and_row_mean_percentile_match_numpy_per_row():
    gen = torch.Generator().manual_seed(5)
    cos = torch.rand(6, 9, generator=gen) * 2 - 1
    negatives = torch.rand(6, 9, generator=gen) > 0.3
    scaled = minmax_rows(cos, negatives)
    for i in range(6):
        row = cos[i][negatives[i]].numpy()
        expected = (row - row.min()) / (row.max() - row.min())
        assert np.allclose(scaled[i][negatives[i]].numpy(), expected, atol=1e-6)
        assert math.isclose(row_percentiles(cos, negatives, 99.0)[i].item(), float(np.percentile(row, 99.0)),
                            rel_tol=1e-5)
    rule = HexRule(epsilon=EpsilonRule(mode="adaptive", percentile=99.0, scale="minmax", reduce="row_mean"))
    selection = rule.select(cosines=cos, negatives=negatives, step=0, total_steps=None)
    eps = np.mean([np.percentile(scaled[i][negatives[i]].numpy(), 99.0) for i in range(6)])
    assert math.isclose(selection.epsilon, eps, rel_tol=1e-5)
    assert torch.equal(selection.hierarchy, (scaled > eps) & negatives)
    # Every row's maximum is 1 after min-max scaling: a threshold below 1 never leaves a row with negatives empty.
    fixed = HexRule(epsilon=EpsilonRule(mode="fixed", value=0.9, scale="minmax")).select(
        cosines=cos, negatives=negatives, step=0, total_steps=None)
    assert (fixed.hierarchy.sum(1) >= 1).all()


def test_authors_threshold_steps_down_and_warm_up_is_plain_info_nce():
    settings = HexSettings.authors()
    rule = settings.rule()
    assert rule.weighting == "hard_negative" and rule.epsilon.scale == "minmax" and rule.warmup_epochs == 10
    cos = torch.rand(4, 4, generator=torch.Generator().manual_seed(6))
    negatives = ~torch.eye(4, dtype=torch.bool)
    assert rule.warmup_steps(total_steps=300, epochs=30) == 100
    warm = rule.select(cosines=cos, negatives=negatives, step=99, total_steps=300, epochs=30)
    assert warm.warmup and not warm.hierarchy.any() and warm.stats()["hex/warmup"] == 1.0
    eps = [rule.select(cosines=cos, negatives=negatives, step=s, total_steps=300, epochs=30).epsilon
           for s in (100, 200, 290)]  # the schedule runs over the HEX phase, steps 100-300
    assert eps[0] == pytest.approx(0.9) and eps[1] == pytest.approx(0.8) and eps[2] == pytest.approx(0.7)
    with pytest.raises(ConfigError, match="train.epochs"):
        rule.warmup_steps(total_steps=100, epochs=10)
    with pytest.raises(ConfigError, match="warmup_epochs"):
        rule.warmup_steps(total_steps=100, epochs=None)


def test_simclr_with_the_authors_settings_is_nt_xent_until_the_warm_up_ends():
    torch.manual_seed(0)
    backbone, head = torch.nn.Identity(), torch.nn.Identity()
    method = SimCLR(backbone=backbone, head=head, temperature=0.5,
                    hex_rule=HexSettings.authors(warmup_epochs=2.0).rule())
    method.on_train_start(total_steps=40, epochs=4)  # 10 steps an epoch: HEX starts at step 20
    v1, v2 = views(batch=8, dim=6, seed=7)
    warm, stats = method.training_loss(v1, v2, step=19)
    assert torch.allclose(warm, nt_xent(z1=v1, z2=v2, temperature=0.5), atol=1e-6) and stats["hex/warmup"] == 1.0
    on, stats = method.training_loss(v1, v2, step=20)
    assert stats["hex/warmup"] == 0.0 and stats["hex/mean_hierarchy_size"] >= 1 and stats["hex/epsilon"] == 0.9
    assert not torch.allclose(on, warm)


# ---------------------------------------------------------------------------------------------------- keys
def test_earlier_hex_configs_keep_their_cache_keys():
    from pipeline_config.loader import load_config
    from contrastive.modalities.image.config import MethodConfig
    before = {"enabled": True, "hierarchy": "threshold",
              "epsilon": {"mode": "adaptive", "value": 0.5, "start": 0.8, "end": 0.4, "milestones": [0.5],
                          "percentile": 90.0},
              "q": {"mode": "constant", "value": 0.5, "start": 1.0, "end": 0.5, "max": 1.0}}
    assert load_config("trifeature_simclr_hex").method.in_use()["hex"] == before  # as written before this mode
    authors = MethodConfig(hex=HexSettings.authors()).in_use()["hex"]
    assert authors["weighting"] == "hard_negative" and authors["warmup_epochs"] == 10.0
    assert authors["epsilon"]["scale"] == "minmax" and "online" not in authors
    assert hex_key_content({**before, "warmup_epochs": 0.0, "hard": {"tau_plus": 0.1, "beta": 1.0}}) == before


def test_authors_settings_validate_with_the_fix():
    from contrastive.methods.hex import HardNegativeSettings
    from pipeline_config.loader import config_from_dict
    from contrastive.modalities.image.config import MethodConfig
    with pytest.raises(ConfigError, match="tau_plus"):
        HardNegativeSettings(tau_plus=1.0)
    with pytest.raises(ConfigError, match="tau_plus"):
        config_from_dict({"method": {"hex": {"enabled": True, "hard": {"tau_plus": 1.5}}}})
    with pytest.raises(ConfigError, match="weighting"):
        HexSettings(weighting="debiased")
    with pytest.raises(ConfigError, match="scale"):
        EpsilonRule(scale="rank")
    section = MethodConfig(hex=HexSettings.authors(hard=HardNegativeSettings(tau_plus=0.2, beta=0.5))).model_dump(
        mode="json")["hex"]
    rule = HexRule.from_config(section)
    assert rule.hard.tau_plus == 0.2 and rule.weighting == "hard_negative"


def test_a_warm_up_as_long_as_training_is_refused_before_any_compute():
    from pipeline_config.loader import config_from_dict
    with pytest.raises(ConfigError, match="raise train.epochs"):
        config_from_dict({"method": {"hex": {"enabled": True, "warmup_epochs": 10}}, "train": {"epochs": 8}})
    config = config_from_dict({"method": {"hex": {"enabled": True, "warmup_epochs": 2}}, "train": {"epochs": 8}})
    assert config.method.hex.rule().warmup_steps(total_steps=80, epochs=8) == 20


def test_pipeline_ids_of_earlier_configs_are_unchanged():
    """config_hash (the pipeline id) of the presets as computed before the later method sections and HEX fields
    existed (commit 9306593): they count only away from their defaults."""
    from pipeline_config.loader import load_config
    assert load_config("trifeature_mcl").config_hash() == "c892462555b06366"
    assert load_config("trifeature_simclr_hex").config_hash() == "b7f018255f9335f8"
    assert load_config("trifeature_nnclr_hex").config_hash() == "6b652fdbfdb070e3"
    changed = load_config("trifeature_mcl", ["method.name=vicreg", "method.vicreg.sim_coeff=10"])
    assert changed.method.content()["vicreg"]["sim_coeff"] == 10.0 and changed.config_hash() != "c892462555b06366"
