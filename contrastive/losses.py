"""Contrastive losses. Shapes: B = views per side of the batch, D = projection dimension."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def nt_xent(*, z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's normalised-temperature cross entropy (Chen et al., 2020, eq. 1), averaged over all 2B anchors.

    z1, z2: (B, D) projections of two views of the same B samples; row i of z1 and row i of z2 are positives,
    every other of the 2B - 2 rows is a negative:
        l(i, j) = -log( exp(s_ij / tau) / sum_{k != i} exp(s_ik / tau) ),  s = cosine similarity.
    Returns a scalar tensor.
    """
    if z1.shape != z2.shape or z1.ndim != 2:
        raise ValueError(f"z1 and z2 must both be (B, D); got {tuple(z1.shape)} and {tuple(z2.shape)}")
    batch = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2], dim=0), dim=1)
    logits = z @ z.T / temperature
    # An anchor is never its own negative: mask the diagonal out of the softmax denominator.
    logits.fill_diagonal_(float("-inf"))
    positives = torch.cat([torch.arange(batch, 2 * batch), torch.arange(0, batch)]).to(z.device)
    return F.cross_entropy(logits, positives)
