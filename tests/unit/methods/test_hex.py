"""HEX loss and its rules against hand-written per-anchor references and closed forms."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from contrastive.errors import ConfigError
from contrastive.methods.hex import (EpsilonRule, HardNegativeSettings, HexRule, HexSettings, OnlineClusterSettings,
                                     QRule, cosine_schedule, minmax_rows, percentile, progress_of, row_percentiles,
                                     step_schedule)
from contrastive.methods.losses import (cross_view_info_nce, hex_cross_entropy, hex_info_nce,
                                nt_xent, queue_info_nce, two_view_negatives)


def hex_reference(z1, z2, temperature, *, in_hierarchy, weight):
    """Per-anchor loop of the HEX formula: in_hierarchy(i, n, cos) -> bool, weight(i, n, cos) -> Q_in."""
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    n, batch = len(z), len(z1)
    total = 0.0
    for i in range(n):
        j = (i + batch) % n
        denominator = torch.exp(z[i] @ z[j] / temperature)
        for k in range(n):
            if k in (i, j):
                continue
            cos = (z[i] @ z[k]).item()
            term = torch.exp(z[i] @ z[k] / temperature)
            denominator = denominator + (weight(i, k, cos) * term if in_hierarchy(i, k, cos) else term)
        total += -torch.log(torch.exp(z[i] @ z[j] / temperature) / denominator)
    return total / n


def views(batch=6, dim=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, dim, generator=gen), torch.randn(batch, dim, generator=gen)


def test_matches_brute_force_per_anchor_loop():
    z1, z2 = views()
    loss, stats = hex_info_nce(z1=z1, z2=z2, temperature=0.3, epsilon=0.1, q=0.3)
    expected = hex_reference(z1, z2, 0.3, in_hierarchy=lambda i, k, c: c > 0.1, weight=lambda i, k, c: 0.3)
    assert torch.allclose(loss, expected, atol=1e-5)
    assert stats["hex/epsilon"] == 0.1 and stats["hex/q_mean"] == 0.3 and 0 < stats["hex/mean_hierarchy_size"] < 10


def test_per_pair_q_tensor_matches_brute_force():
    z1, z2 = views(seed=1)
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    q = (0.8 * (1 - z @ z.T)).clamp(0, 1)  # Q as a function of similarity
    loss, stats = hex_info_nce(z1=z1, z2=z2, temperature=0.5, epsilon=0.0, q=q)
    expected = hex_reference(z1, z2, 0.5, in_hierarchy=lambda i, k, c: c > 0.0, weight=lambda i, k, c: q[i, k])
    assert torch.allclose(loss, expected, atol=1e-5)
    hierarchy = (z @ z.T > 0) & two_view_negatives(6)
    assert math.isclose(stats["hex/q_mean"], q[hierarchy].mean().item(), rel_tol=1e-5)


def test_q_one_equals_nt_xent():
    z1, z2 = views(seed=2)
    for epsilon in (-1.0, 0.0, 0.5):
        loss, _ = hex_info_nce(z1=z1, z2=z2, temperature=0.2, epsilon=epsilon, q=1.0)
        assert torch.allclose(loss, nt_xent(z1=z1, z2=z2, temperature=0.2), atol=1e-6)


def test_q_zero_removes_hierarchy_negatives():
    z1, z2 = views(seed=3)
    loss, _ = hex_info_nce(z1=z1, z2=z2, temperature=0.4, epsilon=0.2, q=0.0)
    # Brute force: the hierarchy negatives are simply absent from the denominator.
    removed = hex_reference(z1, z2, 0.4, in_hierarchy=lambda i, k, c: c > 0.2, weight=lambda i, k, c: 0.0)
    assert torch.isfinite(loss) and torch.allclose(loss, removed, atol=1e-5)
    z1.requires_grad_(True)
    loss, _ = hex_info_nce(z1=z1, z2=z2, temperature=0.4, epsilon=0.2, q=0.0)
    loss.backward()
    assert torch.isfinite(z1.grad).all()


def test_gradient_on_hierarchy_logits_scales_with_q():
    """dL/ds_ih = Q_ih e^{s_ih} / denominator / N: Q is a real weight, not clamped to a constant."""
    gen = torch.Generator().manual_seed(4)
    positive = torch.randn(3, generator=gen)
    negatives = torch.randn(3, 5, generator=gen)
    hierarchy = torch.zeros(3, 5, dtype=torch.bool)
    hierarchy[:, :2] = True
    grads, losses = {}, {}
    for q in (0.25, 0.5, 1.0):
        s = negatives.clone().requires_grad_(True)
        loss = hex_cross_entropy(positive_logits=positive, negative_logits=s, hierarchy=hierarchy, q=q).mean()
        loss.backward()
        weights = torch.where(hierarchy, torch.full_like(s, q), torch.ones_like(s))
        denominator = positive.exp() + (weights * negatives.exp()).sum(1)
        expected = weights * negatives.exp() / denominator[:, None] / 3
        assert torch.allclose(s.grad, expected, atol=1e-6)
        grads[q], losses[q] = s.grad.clone(), loss.item()
    assert losses[0.25] < losses[0.5] < losses[1.0]
    # Holding the denominator fixed, the hierarchy gradient is proportional to Q: compare the ratio to a
    # non-hierarchy logit of the same row (whose gradient has the same denominator).
    for q in (0.25, 0.5, 1.0):
        ratio = grads[q][:, 0] / grads[q][:, 2] * negatives[:, 2].exp() / negatives[:, 0].exp()
        assert torch.allclose(ratio, torch.full_like(ratio, q), atol=1e-5)


def test_empty_hierarchy_is_nt_xent_whatever_q():
    z1, z2 = views(seed=5)
    q_tensor = torch.rand(12, 12)
    for q in (0.0, 0.3, q_tensor):
        loss, stats = hex_info_nce(z1=z1, z2=z2, temperature=0.3, epsilon=1.0, q=q)  # cos > 1 never holds
        assert torch.allclose(loss, nt_xent(z1=z1, z2=z2, temperature=0.3), atol=1e-6)
        assert stats["hex/mean_hierarchy_size"] == 0.0
    assert math.isnan(stats["hex/q_mean"])  # no pair to average Q over


def test_everything_in_hierarchy_closed_form():
    z1, z2 = views(seed=6)
    mask = torch.ones(12, 12, dtype=torch.bool)
    loss, stats = hex_info_nce(z1=z1, z2=z2, temperature=0.5, epsilon=None, q=0.5, hierarchy_mask=mask)
    assert stats["hex/mean_hierarchy_size"] == 10.0  # 2B - 2: self and positive are never in H(i)
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    s = z @ z.T / 0.5
    positives = (torch.arange(12) + 6) % 12
    negatives = two_view_negatives(6)
    expected = torch.stack([-s[i, positives[i]] + torch.log(s[i, positives[i]].exp()
                                                            + 0.5 * s[i][negatives[i]].exp().sum())
                            for i in range(12)]).mean()
    assert torch.allclose(loss, expected, atol=1e-5)
    zero, _ = hex_info_nce(z1=z1, z2=z2, temperature=0.5, epsilon=None, q=0.0, hierarchy_mask=mask)
    assert abs(zero.item()) < 1e-6  # only the positive is left: -log(1) = 0


def test_negative_q_is_a_config_error():
    z1, z2 = views()
    with pytest.raises(ConfigError, match="method.hex.q"):
        hex_info_nce(z1=z1, z2=z2, temperature=0.3, epsilon=0.1, q=-0.5)


def test_queue_and_cross_view_losses_match_brute_force():
    gen = torch.Generator().manual_seed(7)
    query, key = torch.randn(4, 3, generator=gen), torch.randn(4, 3, generator=gen)
    queue = torch.randn(9, 3, generator=gen)
    hierarchy = torch.rand(4, 9, generator=gen) > 0.5
    qn, kn, un = F.normalize(query, dim=1), F.normalize(key, dim=1), F.normalize(queue, dim=1)
    expected = torch.stack([-torch.log(torch.exp(qn[i] @ kn[i] / 0.2) / (torch.exp(qn[i] @ kn[i] / 0.2) + sum(
        (0.3 if hierarchy[i, n] else 1.0) * torch.exp(qn[i] @ un[n] / 0.2) for n in range(9))))
        for i in range(4)]).mean()
    got = queue_info_nce(query=query, key=key, queue=queue, temperature=0.2, hierarchy=hierarchy, q=0.3)
    assert torch.allclose(got, expected, atol=1e-5)

    anchors, candidates = torch.randn(5, 3, generator=gen), torch.randn(5, 3, generator=gen)
    an, cn = F.normalize(anchors, dim=1), F.normalize(candidates, dim=1)
    hierarchy = torch.rand(5, 5, generator=gen) > 0.5
    expected = torch.stack([-torch.log(torch.exp(an[i] @ cn[i] / 0.1) / sum(
        (0.3 if hierarchy[i, k] and k != i else 1.0) * torch.exp(an[i] @ cn[k] / 0.1) for k in range(5)))
        for i in range(5)]).mean()
    got = cross_view_info_nce(anchors=anchors, candidates=candidates, temperature=0.1, hierarchy=hierarchy, q=0.3)
    assert torch.allclose(got, expected, atol=1e-5)
    plain = cross_view_info_nce(anchors=anchors, candidates=candidates, temperature=0.1)
    assert torch.allclose(plain, F.cross_entropy(an @ cn.T / 0.1, torch.arange(5)), atol=1e-6)


# ---------------------------------------------------------------------------------------------------- rules
def test_adaptive_epsilon_is_numpy_percentile():
    values = torch.randn(1001, generator=torch.Generator().manual_seed(8))
    for p in (1.0, 37.5, 90.0, 99.9):
        assert math.isclose(percentile(values, p), float(np.percentile(values.numpy(), p)), rel_tol=1e-5, abs_tol=1e-6)
    z1, z2 = views(batch=8, dim=4, seed=9)
    both = torch.cat([z1, z2])
    cos = F.normalize(both, dim=1) @ F.normalize(both, dim=1).T
    negatives = two_view_negatives(8)
    rule = HexRule(epsilon=EpsilonRule(mode="adaptive", percentile=75.0))
    selection = rule.select(cosines=cos, negatives=negatives, step=0, total_steps=None)
    assert math.isclose(selection.epsilon, float(np.percentile(cos[negatives].numpy(), 75.0)), rel_tol=1e-5)
    # about a quarter of the negatives are above the 75th percentile
    assert abs(selection.hierarchy.sum().item() / negatives.sum().item() - 0.25) < 0.02


def test_epsilon_and_q_schedules():
    assert cosine_schedule(start=0.8, end=0.4, progress=0.0) == 0.8
    assert math.isclose(cosine_schedule(start=0.8, end=0.4, progress=0.5), 0.6)
    assert math.isclose(cosine_schedule(start=0.8, end=0.4, progress=1.0), 0.4)
    assert step_schedule(start=0.8, end=0.2, milestones=(0.3, 0.6), progress=0.29) == 0.8
    assert math.isclose(step_schedule(start=0.8, end=0.2, milestones=(0.3, 0.6), progress=0.3), 0.5)
    assert math.isclose(step_schedule(start=0.8, end=0.2, milestones=(0.3, 0.6), progress=0.9), 0.2)
    cos = torch.tensor([[0.9, -0.5], [0.2, 1.0]])
    assert torch.allclose(QRule(mode="similarity", value=2.0, max=1.0)(progress=0.0, cosines=cos),
                          torch.tensor([[0.2, 1.0], [1.0, 0.0]]))
    assert math.isclose(QRule(mode="schedule", start=1.0, end=0.5)(progress=1.0, cosines=cos), 0.5)
    rule = HexRule(epsilon=EpsilonRule(mode="cosine", start=0.9, end=0.1))
    with pytest.raises(ConfigError, match="on_train_start"):
        rule.select(cosines=cos, negatives=torch.ones(2, 2, dtype=torch.bool), step=3, total_steps=None)
    selection = rule.select(cosines=cos, negatives=torch.ones(2, 2, dtype=torch.bool), step=5, total_steps=10)
    assert math.isclose(selection.epsilon, 0.5)


def test_invalid_rules_name_the_fix():
    with pytest.raises(ConfigError, match=r"\[-1, 1\]"):
        EpsilonRule(mode="fixed", value=1.5)
    with pytest.raises(ConfigError, match=r"\(0, 100\)"):
        EpsilonRule(percentile=100.0)
    with pytest.raises(ConfigError, match=">= 0"):
        QRule(value=-1.0)
    with pytest.raises(ConfigError, match="earlier_clusters"):
        HexRule(hierarchy="nope")


def test_hierarchy_from_earlier_clusters():
    groups = torch.tensor([0, 0, 1, -1])
    anchors = groups.repeat(2)  # rows [view1; view2]
    rule = HexRule(hierarchy="earlier_clusters")
    cos = torch.zeros(8, 8)
    selection = rule.select(cosines=cos, negatives=two_view_negatives(4), step=0, total_steps=None,
                            anchor_groups=anchors, candidate_groups=anchors)
    expected = (anchors[:, None] == anchors[None, :]) & (anchors[:, None] >= 0) & two_view_negatives(4)
    assert torch.equal(selection.hierarchy, expected) and selection.from_groups and selection.epsilon is None
    assert selection.hierarchy[0].tolist() == [False, True, False, False, False, True, False, False]
    assert not selection.hierarchy[3].any()  # unknown group: never in H
    fallback = rule.select(cosines=cos, negatives=two_view_negatives(4), step=0, total_steps=None)
    assert not fallback.from_groups  # stage 0 has no earlier clusters: threshold


def test_from_config_matches_schema_defaults():
    from contrastive.modalities.image.config import MethodConfig
    assert HexRule.from_config(MethodConfig().model_dump(mode="json")["hex"]) is None
    section = MethodConfig(hex={"enabled": True, "epsilon": {"mode": "step", "milestones": [0.2, 0.7]},
                                "q": {"mode": "similarity", "value": 0.9}}).model_dump(mode="json")["hex"]
    rule = HexRule.from_config(section)
    assert rule.epsilon.milestones == (0.2, 0.7) and rule.q.mode == "similarity" and rule.needs_progress


def test_schema_rejects_bad_hex_values_with_the_fix():
    from pipeline_config.loader import config_from_dict
    for override, message in [({"epsilon": {"value": 2.0}}, r"\[-1, 1\]"), ({"q": {"value": -0.1}}, ">= 0"),
                              ({"epsilon": {"percentile": 0}}, r"\(0, 100\)")]:
        with pytest.raises(ConfigError, match=message):
            config_from_dict({"method": {"hex": {"enabled": True, **override}}})


# ------------------------------------------------------- what the mutation run of hex.py found untested
def _refusal(make) -> str:
    with pytest.raises(ConfigError) as refused:
        make()
    return str(refused.value)


def test_every_hex_setting_refused_says_which_and_what_to_use():
    assert _refusal(lambda: EpsilonRule(mode="linear")) == (
        "method.hex.epsilon.mode 'linear' is unknown: use one of fixed, step, cosine, adaptive")
    assert _refusal(lambda: EpsilonRule(scale="rank")) == (
        "method.hex.epsilon.scale 'rank' is unknown: use one of cosine, minmax")
    assert _refusal(lambda: EpsilonRule(reduce="max")) == (
        "method.hex.epsilon.reduce 'max' is unknown: use one of pooled, row_mean")
    assert _refusal(lambda: EpsilonRule(mode="step", milestones=(0.6, 0.3))) == (
        "method.hex.epsilon.milestones=[0.6, 0.3] must be increasing fractions of training in (0, 1), e.g. [0.5]")
    assert _refusal(lambda: QRule(mode="learnt")) == (
        "method.hex.q.mode 'learnt' is unknown: use one of constant, schedule, similarity")
    assert _refusal(lambda: HexRule(hierarchy="labels")) == (
        "method.hex.hierarchy 'labels' is unknown: use one of threshold, earlier_clusters, online_clusters")
    assert _refusal(lambda: HexRule(weighting="p")) == "method.hex.weighting 'p' is unknown: use one of q, hard_negative"
    assert _refusal(lambda: HexRule(warmup_epochs=-1.0)) == (
        "method.hex.warmup_epochs=-1.0 must be >= 0 (0: HEX from the first step; the authors use 10)")
    assert _refusal(lambda: HardNegativeSettings(beta=-1.0)) == (
        "method.hex.hard.beta=-1.0 must be a finite value >= 0 (0: uniform weights, the authors use 1)")
    assert _refusal(lambda: OnlineClusterSettings(k=1)) == (
        "method.hex.online.k=1 must be >= 2: one online cluster cannot split a batch")
    assert _refusal(lambda: OnlineClusterSettings(min_rate=0.0)) == (
        "method.hex.online.min_rate=0.0 must be in (0, 1], e.g. 0.05")


@pytest.mark.parametrize("make", [
    lambda: EpsilonRule(mode="fixed", value=-1.5), lambda: EpsilonRule(mode="step", milestones=(1.5,)),
    lambda: EpsilonRule(mode="step", milestones=(0.0, 0.5)), lambda: EpsilonRule(mode="step", milestones=(0.5, 1.0)),
    lambda: HardNegativeSettings(beta=math.inf), lambda: HexRule(warmup_epochs=math.inf),
    lambda: OnlineClusterSettings(min_rate=1.5)])
def test_a_hex_setting_just_outside_its_range_is_refused(make):
    with pytest.raises(ConfigError):
        make()


def test_the_ends_of_each_hex_settings_range_are_accepted():
    assert [EpsilonRule(mode="fixed", value=v).value for v in (-1.0, 1.0)] == [-1.0, 1.0]
    assert EpsilonRule(percentile=0.5).percentile == 0.5
    assert EpsilonRule(mode="cosine", milestones=(0.6, 0.3)).milestones == (0.6, 0.3)  # read by "step" only
    assert (HardNegativeSettings(tau_plus=0.0, beta=0.0).tau_plus, OnlineClusterSettings(min_rate=1.0).min_rate) == (
        0.0, 1.0)


def test_a_schedule_asked_without_the_run_length_or_before_its_warm_up_names_the_fix():
    assert _refusal(lambda: progress_of(step=3, total_steps=None)) == (
        "HEX epsilon/Q schedules need the run length: call method.on_train_start(total_steps=...) before "
        "training_loss (the engine loop does, through the task's on_train_start), or use a fixed epsilon and a "
        "constant Q")
    assert _refusal(lambda: HexRule(warmup_epochs=2.0).warmup_steps(total_steps=None, epochs=None)) == (
        "method.hex.warmup_epochs needs the run length in steps and epochs: call method.on_train_start("
        "total_steps=..., epochs=...) before training_loss (the image task does), or set method.hex.warmup_epochs=0")
    assert HexRule(warmup_epochs=0.5).warmup_steps(total_steps=100, epochs=10) == 5  # half an epoch of 10 steps


def test_schedules_past_the_end_of_training_stay_at_their_end():
    assert progress_of(step=15, total_steps=10) == 1.0
    assert cosine_schedule(start=0.9, end=0.5, progress=1.5) == pytest.approx(0.5)


def test_percentiles_of_one_entry_and_of_none():
    assert percentile(torch.tensor([3.0]), 50) == 3.0 and math.isnan(percentile(torch.zeros(0), 50))
    values = torch.tensor([[0.3, 0.9, 0.1], [0.5, 0.7, 0.2]])
    mask = torch.tensor([[False, True, False], [False, False, False]])
    got = row_percentiles(values, mask, 40)
    assert got[0].item() == pytest.approx(0.9) and math.isnan(got[1].item())
    rule = EpsilonRule(mode="adaptive", reduce="row_mean", percentile=40)
    assert math.isnan(rule(progress=0.0, scores=values, negatives=torch.zeros(2, 3, dtype=torch.bool)))


def test_minmax_rows_rescales_a_narrow_row_to_zero_one_and_leaves_the_rest_zero():
    """(c - min) / (max - min) over each row's masked entries: a span of 0.5 is stretched to [0, 1] too."""
    values = torch.tensor([[0.2, 0.7, 0.45, -0.9], [0.3, 0.3, 0.8, 0.1]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    expected = torch.tensor([[0.0, 1.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(minmax_rows(values, mask), expected, rtol=0, atol=1e-6)


def test_similarity_q_is_never_negative_for_a_cosine_rounded_above_one():
    q = QRule(mode="similarity", value=2.0, max=1.0)(progress=0.0, cosines=torch.tensor([[1.0 + 1e-6, 0.75, -1.0]]))
    assert torch.equal(q, torch.tensor([[0.0, 0.5, 1.0]]))  # exactly 0: a weight of -2e-6 is within assert_close's


def test_a_hex_section_read_from_json_keeps_every_field_and_its_defaults():
    assert HexRule.from_config({"hierarchy": "online_clusters"}) is None  # "enabled" absent: HEX is off
    assert HexRule.from_config({"enabled": True}) == HexRule()
    section = {"enabled": True, "hierarchy": "online_clusters", "warmup_epochs": 2, "online": {"k": 4}}
    assert HexRule.from_config(section) == HexRule(hierarchy="online_clusters", warmup_epochs=2.0,
                                                   online=OnlineClusterSettings(k=4))
    assert HexSettings(enabled=True, online=OnlineClusterSettings(k=4)).rule().online.k == 4
    assert HexSettings(online=OnlineClusterSettings(k=4)).rule() is None


def test_the_authors_settings_are_the_posters():
    authors = HexSettings.authors()
    assert authors.epsilon.milestones == (1 / 3, 2 / 3) and authors.hard == HardNegativeSettings(tau_plus=0.1, beta=1.0)
    assert (authors.hierarchy, authors.weighting, authors.warmup_epochs) == ("threshold", "hard_negative", 10.0)


def test_the_weights_are_the_rules_of_this_step():
    from contrastive.methods.losses import HardNegativeWeighting
    hard = HexRule(weighting="hard_negative", hard=HardNegativeSettings(tau_plus=0.2, beta=2.0))
    assert hard.weights(progress=0.0, cosines=torch.zeros(1, 1)) == HardNegativeWeighting(tau_plus=0.2, beta=2.0)
    scheduled = HexRule(q=QRule(mode="schedule", start=1.0, end=0.5))
    assert scheduled.weights(progress=1.0, cosines=torch.zeros(1, 1)) == pytest.approx(0.5)
    similar = HexRule(q=QRule(mode="similarity", value=1.0)).weights(progress=0.0, cosines=torch.tensor([[0.25]]))
    assert torch.equal(similar, torch.tensor([[0.75]]))
    selection = HexRule(epsilon=EpsilonRule(mode="fixed", value=0.7)).select(
        cosines=torch.tensor([[0.9, 0.1]]), negatives=torch.ones(1, 2, dtype=torch.bool), step=0, total_steps=10)
    assert selection.stats()["hex/epsilon"] == pytest.approx(0.7)
