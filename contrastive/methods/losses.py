"""Contrastive losses. Shapes: B = views per side of the batch, D = projection dimension."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from contrastive.engine.precision import fp32_logits


@fp32_logits
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
    # An anchor is never its own negative: mask the diagonal out of the softmax denominator (a mask, not
    # fill_diagonal_, which makes torch.compile specialise on the batch size). Indices made on the device: no copy.
    logits = logits.masked_fill(torch.eye(2 * batch, dtype=torch.bool, device=z.device), float("-inf"))
    return F.cross_entropy(logits, two_view_positives(batch, device=z.device))


# ---------------------------------------------------------------------------------------------------- HEX
@dataclass(frozen=True)
class HardNegativeWeighting:
    """The HEX authors' weighting of H(i) (``method.hex.weighting: hard_negative``), used in place of Q: tau_plus =
    the class prior tau+ of the debiased estimate, beta = the hard-negative concentration (see
    :func:`hard_negative_hierarchy_term`)."""
    tau_plus: float = 0.1
    beta: float = 1.0


def hard_negative_hierarchy_term(*, positive_logits: torch.Tensor, negative_logits: torch.Tensor,
                                 hierarchy: torch.Tensor, weighting: HardNegativeWeighting, temperature: float,
                                 shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The hierarchy term of the HEX authors' loss, a debiased hard-negative estimate over H(i) only
    (Chuang et al., 2020, debiased contrastive loss; Robinson et al., 2021, hard negatives, eq. 5 and their code).

    With s = logits (cos / tau), M_i = |H(i)|, pos_i = e^{s_ij}:
        w_ih  = e^{beta s_ih} / ( (1 / M_i) sum_{h' in H(i)} e^{beta s_ih'} )            (importance, mean 1 on H(i))
        Ng_i  = ( sum_{h in H(i)} w_ih e^{s_ih} - tau+ M_i pos_i ) / (1 - tau+)
        H~_i  = max( Ng_i, M_i e^{-1/tau} )        (e^{-1/tau}: the smallest e^{s} a cosine can give)
    As in Robinson et al.'s code the weights w carry gradient. The floor is per row (M_i of that row): a floor
    shared by every row would make the term a constant and switch HEX off (a pitfall of the reference code).
    Everything is returned multiplied by e^{-shift_i} (shift: (N,) a per-row constant, for overflow safety).
    Returns (H~_i e^{-shift_i} (N,), clamped (N,) bool: rows whose estimate sat on the floor). Rows with an
    empty H(i) give 0 and are not clamped.
    """
    finite = torch.isfinite(negative_logits)
    in_h = hierarchy & finite
    size = in_h.sum(dim=1).to(negative_logits.dtype)
    exp_neg = torch.where(in_h, (negative_logits - shift[:, None]).exp(), torch.zeros_like(negative_logits))
    # Rows with an empty H(i) get finite dummy logits (their weights are zeroed next): no NaN in the backward.
    empty = ~in_h.any(dim=1, keepdim=True)
    beta_logits = torch.where(in_h, weighting.beta * negative_logits,
                              torch.where(empty, torch.zeros_like(negative_logits), torch.full_like(negative_logits,
                                                                                                    float("-inf"))))
    importance = torch.where(in_h, torch.softmax(beta_logits, dim=1), torch.zeros_like(negative_logits))
    importance = importance * size[:, None]
    positive = (positive_logits - shift).exp()
    estimate = ((importance * exp_neg).sum(dim=1) - weighting.tau_plus * size * positive) / (1.0 - weighting.tau_plus)
    floor = size * torch.exp(-1.0 / temperature - shift)
    clamped = (estimate < floor) & (size > 0)
    return torch.maximum(estimate, floor), clamped


def hex_cross_entropy(*, positive_logits: torch.Tensor, negative_logits: torch.Tensor, hierarchy: torch.Tensor,
                      q: "float | torch.Tensor | HardNegativeWeighting",
                      temperature: float | None = None) -> torch.Tensor:
    """Per-anchor HEX loss (local hierarchy exploitation), the core every HEX method calls.

    positive_logits: (N,) s_ij of each anchor with its positive. negative_logits: (N, M) s_in of each anchor with
    each candidate negative, -inf where n is not a negative of i (the anchor itself, its positive, padding).
    hierarchy: (N, M) bool, H(i). q: a float or an (N, M) tensor of weights Q_in >= 0 (read only inside H(i)).
    Returns (N,):
        L_i = -log( e^{s_ij} / ( e^{s_ij} + sum_{h in H(i)} Q_ih e^{s_ih} + sum_{n notin H(i)} e^{s_in} ) ).
    Q is a real per-pair weight, entered as log Q added to the hierarchy logits, so the denominator is one stable
    logsumexp; Q = 1 is InfoNCE, Q = 0 gives -inf (the negative is removed) and dL/ds_ih = Q_ih e^{s_ih} / denom.

    q = :class:`HardNegativeWeighting` (needs ``temperature``): the HEX authors' loss, the hierarchy sum replaced
    by the debiased hard-negative estimate H~_i of :func:`hard_negative_hierarchy_term`,
        L_i = -log( e^{s_ij} / ( e^{s_ij} + H~_i + sum_{n notin H(i)} e^{s_in} ) ).
    """
    return hex_terms(positive_logits=positive_logits, negative_logits=negative_logits, hierarchy=hierarchy, q=q,
                     temperature=temperature)[0]


def hex_terms(*, positive_logits: torch.Tensor, negative_logits: torch.Tensor, hierarchy: torch.Tensor,
              q: "float | torch.Tensor | HardNegativeWeighting", temperature: float | None = None
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`hex_cross_entropy` and what only the loss knows, to log: with the hard-negative weighting, the
    effective Q of each anchor (H~_i / sum_{h in H(i)} e^{s_ih}, mean over anchors with a non-empty H(i)) as
    ``hex/q_effective`` and the share of those anchors whose estimate sat on its floor, ``hex/clamped_share``."""
    if negative_logits.shape != hierarchy.shape or negative_logits.shape[0] != positive_logits.shape[0]:
        raise ValueError(f"shapes disagree: positives {tuple(positive_logits.shape)}, negatives "
                         f"{tuple(negative_logits.shape)}, hierarchy {tuple(hierarchy.shape)}")
    if isinstance(q, HardNegativeWeighting):
        if temperature is None:
            raise ValueError("the hard-negative HEX weighting needs the temperature (its floor is M e^{-1/tau})")
        positive_logits, negative_logits = positive_logits.float(), negative_logits.float()
        in_h = hierarchy & torch.isfinite(negative_logits)
        shift = torch.maximum(positive_logits, negative_logits.max(dim=1).values).detach()
        term, clamped = hard_negative_hierarchy_term(positive_logits=positive_logits,
                                                     negative_logits=negative_logits, hierarchy=in_h, weighting=q,
                                                     temperature=temperature, shift=shift)
        rest = torch.where(in_h, torch.zeros_like(negative_logits), (negative_logits - shift[:, None]).exp())
        denominator = (positive_logits - shift).exp() + term + rest.sum(dim=1)
        per_anchor = denominator.log() - (positive_logits - shift)
        with torch.no_grad():
            rows = in_h.any(dim=1)
            plain = torch.where(in_h, (negative_logits - shift[:, None]).exp(), torch.zeros_like(rest)).sum(dim=1)
            # Means over the anchors with a non-empty H(i) as masked sums (0 / 0 = NaN when none): no host read.
            anchors = rows.sum()
            stats = {"hex/q_effective": torch.where(rows, term / plain, 0.0).sum() / anchors,
                     "hex/clamped_share": (clamped & rows).sum() / anchors}
        return per_anchor, stats
    log_q = _log_weights(q, like=negative_logits)
    weighted = torch.where(hierarchy, negative_logits + log_q, negative_logits)
    denominator = torch.logsumexp(torch.cat([positive_logits[:, None], weighted], dim=1), dim=1)
    return denominator - positive_logits, {}


def _log_weights(q: float | torch.Tensor, *, like: torch.Tensor) -> torch.Tensor:
    """log Q as a tensor broadcastable to ``like``; Q is a weight, not a learnt quantity, so it carries no grad."""
    q_tensor = torch.as_tensor(q, dtype=like.dtype, device=like.device).detach()
    if q_tensor.ndim not in (0, 2) or (q_tensor.ndim == 2 and q_tensor.shape != like.shape):
        raise ValueError(f"q must be a float or a tensor of shape {tuple(like.shape)}, got {tuple(q_tensor.shape)}")
    # A configured Q (a number) is checked here, on the host; a per-pair Q tensor is the Q rule's clipped output,
    # non-negative by construction, and checking it would wait for the GPU every step (a NaN in it makes the loss
    # NaN, which the loop's non-finite check catches).
    if not isinstance(q, torch.Tensor) and (not math.isfinite(float(q)) or float(q) < 0):
        from contrastive.errors import ConfigError
        raise ConfigError("HEX weight Q must be finite and >= 0 (0 removes the hierarchy negatives, 1 is plain "
                          "InfoNCE): fix method.hex.q")
    return torch.log(q_tensor)


def hex_stats(*, epsilon: float | None, hierarchy: torch.Tensor, q: float | torch.Tensor) -> dict[str, float]:
    """Per-step HEX numbers to log: the threshold, mean |H(i)| over anchors, and the mean Q applied inside H
    (NaN with the hard-negative weighting, whose effective Q the loss logs as ``hex/q_effective``)."""
    size = hierarchy.sum(dim=1).float().mean()  # a tensor: read by the loop at logging steps
    if isinstance(q, HardNegativeWeighting):
        q_mean = float("nan")  # per anchor, known to the loss: logged as hex/q_effective
    elif isinstance(q, torch.Tensor) and q.ndim == 2:  # mean over H as a masked mean: NaN when H is empty
        q_mean = torch.where(hierarchy, q.float(), 0.0).sum() / hierarchy.sum()
    else:
        q_mean = float(q)
    return {"hex/epsilon": float("nan") if epsilon is None else float(epsilon), "hex/mean_hierarchy_size": size,
            "hex/q_mean": q_mean}


def two_view_positives(batch: int, *, device: torch.device | None = None) -> torch.Tensor:
    """(2B,) index of each anchor's positive when rows are [view1; view2]: i <-> i + B."""
    return (torch.arange(2 * batch, device=device) + batch) % (2 * batch)


def two_view_negatives(batch: int, *, device: torch.device | None = None) -> torch.Tensor:
    """(2B, 2B) bool: True where column n is a negative of anchor row i (neither i itself nor its positive)."""
    n = 2 * batch
    eye = torch.eye(n, dtype=torch.bool, device=device)
    positive = torch.zeros_like(eye)
    positive[torch.arange(n, device=device), two_view_positives(batch, device=device)] = True
    return ~(eye | positive)


@torch.no_grad()
@fp32_logits
def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(N, D), (M, D) -> (N, M) cosine similarities, without gradient (used to choose H(i), epsilon and Q)."""
    return F.normalize(a.detach().float(), dim=1) @ F.normalize(b.detach().float(), dim=1).T


@fp32_logits
def hex_info_nce(*, z1: torch.Tensor, z2: torch.Tensor, temperature: float, epsilon: float | None,
                 q: "float | torch.Tensor | HardNegativeWeighting", hierarchy_mask: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, dict[str, float]]:
    """NT-Xent with HEX's weighted hierarchy negatives (SimCLR + HEX), averaged over the 2B anchors.

    z1, z2: (B, D) projections of two views; anchor i (of the 2B rows [z1; z2]) has positive j = i +- B and
    negatives n != i, j. For s = cos / tau:
        L_i = -log( e^{s_ij} / ( e^{s_ij} + sum_{h in H(i)} Q_ih e^{s_ih} + sum_{n notin H(i), n != i, j} e^{s_in} ) )
    H(i) = the negatives whose cosine to the anchor exceeds ``epsilon``, chosen without gradient, unless
    ``hierarchy_mask`` (2B, 2B) bool gives it (e.g. same k-means cluster of an earlier MCL stage; entries outside
    the negatives are ignored). q: float or (2B, 2B) per-pair weights, or :class:`HardNegativeWeighting` (the
    authors' estimate of the hierarchy term). With several ranks, gather z1 and z2 with
    :func:`contrastive.engine.distributed.gather_with_grad` first so H(i) is chosen among every rank's negatives.
    Returns (scalar loss, {"hex/epsilon", "hex/mean_hierarchy_size", "hex/q_mean"} + the loss's own numbers).
    """
    if z1.shape != z2.shape or z1.ndim != 2:
        raise ValueError(f"z1 and z2 must both be (B, D); got {tuple(z1.shape)} and {tuple(z2.shape)}")
    batch, device = z1.shape[0], z1.device
    z = F.normalize(torch.cat([z1, z2], dim=0), dim=1)
    logits = z @ z.T / temperature
    negatives = two_view_negatives(batch, device=device)
    if hierarchy_mask is None:
        if epsilon is None:
            raise ValueError("hex_info_nce needs epsilon or hierarchy_mask to choose H(i)")
        with torch.no_grad():
            hierarchy = (z @ z.T > epsilon) & negatives
    else:
        hierarchy = hierarchy_mask.to(device=device, dtype=torch.bool) & negatives
    rows = torch.arange(2 * batch, device=device)
    per_anchor, loss_stats = hex_terms(positive_logits=logits[rows, two_view_positives(batch, device=device)],
                                       negative_logits=logits.masked_fill(~negatives, float("-inf")),
                                       hierarchy=hierarchy, q=q, temperature=temperature)
    return per_anchor.mean(), {**hex_stats(epsilon=epsilon, hierarchy=hierarchy, q=q), **loss_stats}


@fp32_logits
def cross_view_info_nce(*, anchors: torch.Tensor, candidates: torch.Tensor, temperature: float,
                        hierarchy: torch.Tensor | None = None,
                        q: "float | torch.Tensor | HardNegativeWeighting" = 1.0, with_stats: bool = False):
    """InfoNCE over a (B, B) cross-view similarity matrix, positives on the diagonal (NNCLR, eq. 1), with optional
    HEX weighting of the hierarchy negatives.

    anchors: (B, D) (NNCLR: nearest neighbours NN(z_i) from the support set); candidates: (B, D) (the other view's
    predictions);
        L_i = -log( e^{s_ii} / ( e^{s_ii} + sum_{h in H(i)} Q_ih e^{s_ih} + sum_{k notin H(i), k != i} e^{s_ik} ) ).
    hierarchy: (B, B) bool (the diagonal is ignored); None = plain InfoNCE. Returns the scalar mean over anchors,
    and with ``with_stats`` also the loss's own HEX numbers (:func:`hex_terms`).
    """
    logits = F.normalize(anchors, dim=1) @ F.normalize(candidates, dim=1).T / temperature
    eye = torch.eye(len(logits), dtype=torch.bool, device=logits.device)
    hierarchy = torch.zeros_like(eye) if hierarchy is None else hierarchy.to(torch.bool) & ~eye
    per_anchor, stats = hex_terms(positive_logits=logits.diagonal(),
                                  negative_logits=logits.masked_fill(eye, float("-inf")), hierarchy=hierarchy, q=q,
                                  temperature=temperature)
    return (per_anchor.mean(), stats) if with_stats else per_anchor.mean()


@fp32_logits
def queue_info_nce(*, query: torch.Tensor, key: torch.Tensor, queue: torch.Tensor, temperature: float,
                   hierarchy: torch.Tensor | None = None, q: "float | torch.Tensor | HardNegativeWeighting" = 1.0,
                   with_stats: bool = False):
    """MoCo's InfoNCE (He et al., 2020, eq. 1) with optional HEX weighting of the queue's hierarchy negatives.

    query: (B, D) q = f_q(x); key: (B, D) k+ = f_k(x') (no grad); queue: (K, D) earlier keys, the negatives.
    L_i = -log( e^{q.k+/tau} / ( e^{q.k+/tau} + sum_{h in H(i)} Q_ih e^{q.k_h/tau} + sum_{n notin H(i)} e^{q.k_n/tau} ) )
    hierarchy: (B, K) bool or None. Returns the scalar mean over the B queries, and with ``with_stats`` also the
    loss's own HEX numbers (:func:`hex_terms`).
    """
    query, key, queue = F.normalize(query, dim=1), F.normalize(key, dim=1), F.normalize(queue, dim=1)
    negative_logits = query @ queue.T / temperature
    if hierarchy is None:
        hierarchy = torch.zeros_like(negative_logits, dtype=torch.bool)
    per_anchor, stats = hex_terms(positive_logits=(query * key).sum(dim=1) / temperature,
                                  negative_logits=negative_logits, hierarchy=hierarchy, q=q, temperature=temperature)
    return (per_anchor.mean(), stats) if with_stats else per_anchor.mean()
