import math

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
