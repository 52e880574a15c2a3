import math
import re

import pytest
import torch
import torch.nn.functional as F

from contrastive.methods.losses import nt_xent


def nt_xent_reference(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per-anchor loop straight from SimCLR eq. 1."""
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    n, batch = len(z), len(z1)
    total = 0.0
    for i in range(n):
        j = (i + batch) % n
        sims = [(z[i] @ z[k]) / temperature for k in range(n) if k != i]
        total += -(z[i] @ z[j] / temperature - torch.logsumexp(torch.stack(sims), 0))
    return total / n


def test_matches_per_anchor_reference():
    gen = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(6, 5, generator=gen), torch.randn(6, 5, generator=gen)
    assert torch.allclose(nt_xent(z1=z1, z2=z2, temperature=0.3), nt_xent_reference(z1, z2, 0.3), atol=1e-5)


def test_closed_form_for_orthogonal_negatives():
    # Positives identical, all negatives orthogonal: loss = -log(e^{1/t} / (e^{1/t} + (2B-2) e^0)).
    batch, temperature = 3, 0.5
    z = torch.eye(batch, 8)
    expected = -math.log(math.exp(1 / temperature) / (math.exp(1 / temperature) + 2 * batch - 2))
    assert math.isclose(nt_xent(z1=z, z2=z.clone(), temperature=temperature).item(), expected, rel_tol=1e-5)


def test_scale_invariant_and_gradient_flows():
    z1 = torch.randn(4, 3, requires_grad=True)
    z2 = torch.randn(4, 3)
    loss = nt_xent(z1=z1, z2=z2, temperature=0.2)
    assert torch.allclose(loss, nt_xent(z1=z1 * 7, z2=z2 * 0.1, temperature=0.2), atol=1e-5)
    loss.backward()
    assert z1.grad is not None and torch.isfinite(z1.grad).all() and z1.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------------------- refusals
def test_the_losses_refuse_views_that_are_not_two_equal_b_by_d_matrices_and_say_which():
    from contrastive.methods.losses import hex_info_nce
    for z1, z2 in ((torch.ones(4, 3), torch.ones(5, 3)), (torch.ones(2, 3, 4), torch.ones(2, 3, 4))):
        message = rf"^z1 and z2 must both be \(B, D\); got {re.escape(str(tuple(z1.shape)))} and " \
                  rf"{re.escape(str(tuple(z2.shape)))}$"
        with pytest.raises(ValueError, match=message):
            nt_xent(z1=z1, z2=z2, temperature=0.5)
        with pytest.raises(ValueError, match=message):
            hex_info_nce(z1=z1, z2=z2, temperature=0.5, epsilon=0.5, q=0.5)
    with pytest.raises(ValueError, match=r"^hex_info_nce needs epsilon or hierarchy_mask to choose H\(i\)$"):
        hex_info_nce(z1=torch.ones(2, 3), z2=torch.ones(2, 3), temperature=0.5, epsilon=None, q=0.5)


def test_hex_terms_refuse_disagreeing_shapes_and_weights_q_cannot_be():
    from contrastive.errors import ConfigError
    from contrastive.methods.losses import HardNegativeWeighting, hex_terms
    positives, negatives = torch.zeros(3), torch.zeros(3, 4)
    for hierarchy, positive in ((torch.zeros(3, 5, dtype=torch.bool), positives),
                                (torch.zeros(3, 4, dtype=torch.bool), torch.zeros(2))):
        with pytest.raises(ValueError, match=rf"^shapes disagree: positives {re.escape(str(tuple(positive.shape)))}, "
                                             rf"negatives \(3, 4\), hierarchy {re.escape(str(tuple(hierarchy.shape)))}$"):
            hex_terms(positive_logits=positive, negative_logits=negatives, hierarchy=hierarchy, q=0.5)
    hierarchy = torch.zeros(3, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^the hard-negative HEX weighting needs the temperature \(its floor is "
                                         r"M e\^\{-1/tau\}\)$"):
        hex_terms(positive_logits=positives, negative_logits=negatives, hierarchy=hierarchy, q=HardNegativeWeighting())
    for q in (torch.ones(4), torch.ones(3, 4, 1), torch.ones(4, 3)):  # neither a number nor one Q per pair
        with pytest.raises(ValueError, match=rf"^q must be a float or a tensor of shape \(3, 4\), got "
                                             rf"{re.escape(str(tuple(q.shape)))}$"):
            hex_terms(positive_logits=positives, negative_logits=negatives, hierarchy=hierarchy, q=q)
    for q in (-0.5, float("nan")):
        with pytest.raises(ConfigError, match=r"^HEX weight Q must be finite and >= 0 \(0 removes the hierarchy "
                                              r"negatives, 1 is plain InfoNCE\): fix method\.hex\.q$"):
            hex_terms(positive_logits=positives, negative_logits=negatives, hierarchy=hierarchy, q=q)


def test_hex_takes_only_similarities_above_epsilon_into_the_hierarchy():
    """Orthogonal samples have similarity exactly 0: with epsilon = 0 none is in H(i), so even Q = 0 (which would
    drop every hierarchy negative) leaves NT-Xent; a threshold that also took s = epsilon would give loss 0."""
    from contrastive.methods.losses import hex_info_nce
    z = torch.eye(4)
    loss, _ = hex_info_nce(z1=z, z2=z.clone(), temperature=0.5, epsilon=0.0, q=0.0)
    assert torch.allclose(loss, nt_xent(z1=z, z2=z.clone(), temperature=0.5)) and loss > 0.5


def test_the_cross_view_loss_weights_the_hierarchy_by_1_unless_told():
    from contrastive.methods.losses import cross_view_info_nce
    a, b = torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), torch.randn(5, 3)
    hierarchy = torch.ones(5, 5, dtype=torch.bool)
    plain = cross_view_info_nce(anchors=a, candidates=b, temperature=0.5)
    assert torch.allclose(cross_view_info_nce(anchors=a, candidates=b, temperature=0.5, hierarchy=hierarchy), plain)
    assert not torch.allclose(cross_view_info_nce(anchors=a, candidates=b, temperature=0.5, hierarchy=hierarchy,
                                                  q=2.0), plain)


def test_the_queue_loss_weights_the_hierarchy_by_1_unless_told_and_returns_its_stats_when_asked():
    from contrastive.methods.losses import queue_info_nce
    generator = torch.Generator().manual_seed(1)
    query, key, queue = (torch.randn(n, 3, generator=generator) for n in (4, 4, 6))
    hierarchy = torch.ones(4, 6, dtype=torch.bool)
    plain = queue_info_nce(query=query, key=key, queue=queue, temperature=0.5)
    assert torch.allclose(queue_info_nce(query=query, key=key, queue=queue, temperature=0.5, hierarchy=hierarchy),
                          plain)
    loss, stats = queue_info_nce(query=query, key=key, queue=queue, temperature=0.5, with_stats=True)
    assert torch.allclose(loss, plain) and stats == {}


def test_hex_cross_entropy_hands_the_temperature_to_the_hard_negative_weighting():
    from contrastive.methods.losses import HardNegativeWeighting, hex_cross_entropy, hex_terms
    generator = torch.Generator().manual_seed(2)
    positive, negative = torch.randn(3, generator=generator), torch.randn(3, 5, generator=generator)
    hierarchy = torch.rand(3, 5, generator=generator) > 0.5
    kwargs = dict(positive_logits=positive, negative_logits=negative, hierarchy=hierarchy, q=HardNegativeWeighting())
    assert torch.allclose(hex_cross_entropy(**kwargs, temperature=0.5), hex_terms(**kwargs, temperature=0.5)[0])


def test_an_integer_hierarchy_mask_is_read_as_the_boolean_one():
    from contrastive.methods.losses import cross_view_info_nce, hex_info_nce
    generator = torch.Generator().manual_seed(3)
    z1, z2 = torch.randn(4, 3, generator=generator), torch.randn(4, 3, generator=generator)
    mask = torch.rand(8, 8, generator=generator) > 0.5
    by_bool, _ = hex_info_nce(z1=z1, z2=z2, temperature=0.5, epsilon=None, q=0.3, hierarchy_mask=mask)
    by_int, _ = hex_info_nce(z1=z1, z2=z2, temperature=0.5, epsilon=None, q=0.3, hierarchy_mask=mask.long())
    assert torch.allclose(by_bool, by_int)
    cross = mask[:4, :4]
    assert torch.allclose(cross_view_info_nce(anchors=z1, candidates=z2, temperature=0.5, hierarchy=cross.long(), q=0.3),
                          cross_view_info_nce(anchors=z1, candidates=z2, temperature=0.5, hierarchy=cross, q=0.3))


def test_hard_negative_estimate_per_anchor_in_a_batch_mixing_empty_and_single_member_hierarchies():
    """hard_negative_hierarchy_term against its closed form, anchor by anchor (tau+ = 0.5, beta = 1, tau = 0.5, no
    shift): anchor 0 has H = {0, 1} and an estimate above its floor; anchor 1 an empty H (0, not clamped); anchor 2
    a single member whose estimate (e^0 - tau+ e^5) / (1 - tau+) is negative: it sits on its floor 1 e^{-1/tau} and
    counts as clamped (mutmut: ``size > 1`` missed a one-member H(i)). Then hex_terms' ``hex/q_effective`` is the
    mean of H~_i / sum_{h in H(i)} e^{s_ih} over the two anchors with an H(i) (mutmut: the empty anchor counted as 1)."""
    from contrastive.methods.losses import HardNegativeWeighting, hard_negative_hierarchy_term, hex_terms
    weighting = HardNegativeWeighting(tau_plus=0.5, beta=1.0)
    negative = torch.tensor([[1.0, 0.5, 0.2], [0.3, 0.1, -0.2], [0.0, 0.4, 0.1]], dtype=torch.float64)
    positive = torch.tensor([0.0, 0.0, 5.0], dtype=torch.float64)
    hierarchy = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.bool)
    term, clamped = hard_negative_hierarchy_term(positive_logits=positive, negative_logits=negative,
                                                 hierarchy=hierarchy, weighting=weighting, temperature=0.5,
                                                 shift=torch.zeros(3, dtype=torch.float64))
    weights = [2 * math.exp(s) / (math.exp(1.0) + math.exp(0.5)) for s in (1.0, 0.5)]  # beta = 1, mean 1 on H(0)
    anchor0 = (weights[0] * math.exp(1.0) + weights[1] * math.exp(0.5) - 0.5 * 2 * math.exp(0.0)) / 0.5
    assert (math.exp(0.0) - 0.5 * math.exp(5.0)) / 0.5 < math.exp(-2.0)  # anchor 2 below its floor
    assert torch.allclose(term, torch.tensor([anchor0, 0.0, math.exp(-2.0)], dtype=torch.float64), rtol=1e-12)
    assert clamped.tolist() == [False, False, True]

    # hex_terms shifts every row by its largest logit; the ratio H~_i / sum e^{s_ih} does not move with it
    _, stats = hex_terms(positive_logits=positive, negative_logits=negative, hierarchy=hierarchy, q=weighting,
                         temperature=0.5)
    q0 = anchor0 / (math.exp(1.0) + math.exp(0.5))
    q2 = math.exp(-2.0) / math.exp(0.0)
    assert math.isclose(float(stats["hex/q_effective"]), (q0 + q2) / 2, rel_tol=1e-6)
    assert math.isclose(float(stats["hex/clamped_share"]), 0.5, rel_tol=1e-12)
