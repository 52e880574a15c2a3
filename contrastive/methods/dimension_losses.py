"""Dimension-contrastive losses (VICReg, Barlow Twins) and HEX's local term for them.

Shapes: B = samples per view, D = projection dimension. Sample-contrastive losses (``contrastive.methods.losses``) push
samples apart; these decorrelate the D dimensions over the batch, which prevents GLOBAL dimensional collapse.

HEX for dimension-contrastive methods (the poster: local hierarchies "collapse locally" while SSL prevents only
global dimensional collapse) is a local version of the method's own redundancy term, computed over each anchor's
hierarchy set S_i = {i} u H(i) and weighted by Q:
    L = L_method + coeff * Q * (1/B) sum_i R(S_i),
with R the method's off-diagonal (co)variance penalty re-centred on S_i (:func:`local_offdiagonal_penalty`):
the members of a local hierarchy may share the features that make them a hierarchy (their mean), but inside it
their dimensions must stay decorrelated, i.e. the hierarchy must not collapse onto a few directions.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from contrastive.engine.precision import fp32_logits


def off_diagonal(matrix: torch.Tensor) -> torch.Tensor:
    """The D^2 - D off-diagonal entries of a (D, D) matrix, flattened."""
    d = matrix.shape[0]
    return matrix.flatten()[:-1].view(d - 1, d + 1)[:, 1:].flatten()


@fp32_logits
def vicreg_loss(*, z1: torch.Tensor, z2: torch.Tensor, sim_coeff: float, std_coeff: float, cov_coeff: float,
                gamma: float = 1.0, eps: float = 1e-4) -> tuple[torch.Tensor, dict[str, float]]:
    """VICReg (Bardes, Ponce & LeCun, 2022, eq. 1-6, as in their code): z1, z2 (B, D) the two views' embeddings.
        s = (1 / (B D)) sum_i ||z1_i - z2_i||^2                                           (invariance, MSE)
        v = (1/2) sum_{Z in z1, z2} (1/D) sum_k max(0, gamma - sqrt(Var(Z_{:,k}) + eps))   (variance hinge)
        c = sum_{Z in z1, z2} (1/D) sum_{k != l} C(Z)_kl^2,  C(Z) = (1/(B-1)) (Z - mean)^T (Z - mean)  (covariance)
        L = sim_coeff s + std_coeff v + cov_coeff c   (the paper: 25, 25, 1)
    Returns (scalar loss, {"vicreg/invariance", "vicreg/variance", "vicreg/covariance"})."""
    batch, dim = z1.shape
    invariance = F.mse_loss(z1, z2)
    variance = 0.0
    covariance = 0.0
    for z in (z1, z2):
        centred = z - z.mean(dim=0)
        std = torch.sqrt(centred.var(dim=0) + eps)
        variance = variance + F.relu(gamma - std).mean() / 2
        cov = centred.T @ centred / (batch - 1)
        covariance = covariance + off_diagonal(cov).pow(2).sum() / dim
    loss = sim_coeff * invariance + std_coeff * variance + cov_coeff * covariance
    return loss, {"vicreg/invariance": invariance.detach(), "vicreg/variance": variance.detach(),
                  "vicreg/covariance": covariance.detach()}


def standardise(z: torch.Tensor, *, eps: float = 1e-5) -> torch.Tensor:
    """(B, D) -> each dimension centred and divided by its (biased) batch std: BatchNorm1d without affine."""
    centred = z - z.mean(dim=0)
    return centred / torch.sqrt(centred.pow(2).mean(dim=0) + eps)


@fp32_logits
def barlow_twins_loss(*, z1: torch.Tensor, z2: torch.Tensor, lambd: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Barlow Twins (Zbontar et al., 2021, eq. 1-2): z1, z2 (B, D) standardised along the batch, C (D, D) their
    cross-correlation C_kl = (1/B) sum_b z1_bk z2_bl,
        L = sum_k (1 - C_kk)^2 + lambd sum_{k != l} C_kl^2   (the paper: lambd = 5e-3 for D = 8192).
    Returns (scalar loss, {"barlow/on_diagonal", "barlow/off_diagonal"})."""
    a, b = standardise(z1), standardise(z2)
    c = a.T @ b / len(a)
    on = (1 - torch.diagonal(c)).pow(2).sum()
    off = off_diagonal(c).pow(2).sum()
    return on + lambd * off, {"barlow/on_diagonal": on.detach(), "barlow/off_diagonal": off.detach()}


@fp32_logits
def local_offdiagonal_penalty(*, a: torch.Tensor, b: torch.Tensor, members: torch.Tensor, unbiased: bool,
                              chunk_elements: int = 1 << 24) -> torch.Tensor:
    """HEX's local redundancy: for each anchor i, the off-diagonal energy of the cross-covariance of a and b over
    its set S_i (``members[i]``), re-centred on S_i.

    a, b: (N, D) (the same tensor for an auto-covariance); members: (A, N) bool, S_i; n_i = |S_i|, u = 1 if
    ``unbiased`` else 0:
        C^i = (1 / (n_i - u)) sum_{n in S_i} (a_n - abar_i)(b_n - bbar_i)^T,   abar_i = mean of a over S_i
        R_i = sum_{k != l} (C^i_kl)^2 = ||C^i||_F^2 - sum_k (C^i_kk)^2,        0 where n_i < 2.
    ||C^i||_F^2 = (1 / (n_i - u)^2) sum_{n, m in S_i} <a~_n, a~_m><b~_n, b~_m> with a~ centred on S_i: computed from
    the (N, N) Gram matrices (chunks of anchors, ``chunk_elements`` floats at a time), never a (D, D) per anchor.
    Returns (A,).
    """
    # half precision would lose the centring: @fp32_logits hands a and b over in float32 (or float64)
    masks = members.to(a.dtype)
    counts = masks.sum(dim=1)
    gram_a, gram_b = a @ a.T, b @ b.T
    rows = max(1, chunk_elements // max(1, a.shape[0] ** 2))
    out = []
    for start in range(0, len(masks), rows):
        m, n = masks[start:start + rows], counts[start:start + rows].clamp(min=1)
        frob = (_centred_gram(gram_a, m, n) * _centred_gram(gram_b, m, n) * m[:, :, None] * m[:, None, :]).sum((1, 2))
        mean_a, mean_b = m @ a / n[:, None], m @ b / n[:, None]
        diag = m @ (a * b) - n[:, None] * mean_a * mean_b   # (chunk, D): sum_n (a_nk - abar_k)(b_nk - bbar_k)
        norm = (n - (1.0 if unbiased else 0.0)).clamp(min=1)
        penalty = (frob - diag.pow(2).sum(dim=1)) / norm.pow(2)
        out.append(torch.where(counts[start:start + rows] >= 2, penalty, torch.zeros_like(penalty)))
    return torch.cat(out)


def _centred_gram(gram: torch.Tensor, m: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """(A, N, N): <x_n - xbar_i, x_m - xbar_i> for each anchor's mean xbar_i over its members m_i."""
    u = m @ gram / n[:, None]                      # <x_n, xbar_i>
    v = (u * m).sum(dim=1) / n                     # <xbar_i, xbar_i>
    return gram[None] - u[:, :, None] - u[:, None, :] + v[:, None, None]
