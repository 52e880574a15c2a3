"""Online clusters of the current stage's projections, for HEX's ``hierarchy: online_clusters``.

Why: inside MCL, a stage >= 1 trains on cluster-pure batches (every sample of a batch shares its earlier-stage
pseudo-label), so H(i) = "same earlier cluster" is every negative and HEX degenerates to a constant reweighting.
The current stage's own clusters split such a batch along the features this stage learns, so H(i) = "same
earlier pseudo-label AND same online cluster" is a strict subset: a finer level of the hierarchy.

The clusters are K unit centroids learnt by mini-batch spherical k-means (Sculley, 2010, "Web-scale k-means
clustering") on the detached, normalised projections of every training step. They are registered buffers, so a
checkpoint resumes them; every rank updates them with the same gathered projections, so ranks agree.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class OnlineClusters(nn.Module):
    """K centroids (K, D) on the unit sphere, their assignment counts and how many are initialised.

    :meth:`update` (once per training step, with that step's projections):
      1. empty centroids are seeded with rows of the batch by farthest-point order from the ones already set
         (deterministic: the first seed is row 0);
      2. every row goes to its nearest centroid by cosine, c(x) = argmax_k <x/|x|, mu_k>;
      3. each centroid moves to the mean m_k of its n_k rows with the per-centroid rate
         eta_k = max(n_k / N_k, min_rate), N_k = rows it ever received: mu_k <- normalize(mu_k + eta_k (m_k - mu_k)).
    :meth:`assign` gives cluster ids without learning (e.g. for a queue of older keys).
    """

    def __init__(self, *, k: int, dim: int, min_rate: float):
        super().__init__()
        self.min_rate = min_rate
        self.register_buffer("centroids", torch.zeros(k, dim))
        self.register_buffer("counts", torch.zeros(k, dtype=torch.long))
        self.register_buffer("filled", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def assign(self, x: torch.Tensor) -> torch.Tensor:
        """(N, D) -> (N,) int64 id of the nearest initialised centroid by cosine (all 0 before any update)."""
        filled = int(self.filled)
        if filled == 0:
            return torch.zeros(len(x), dtype=torch.long, device=x.device)
        similarity = F.normalize(x.detach().float(), dim=1) @ self.centroids[:filled].float().T
        return similarity.argmax(dim=1)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> torch.Tensor:
        """One mini-batch k-means step on (N, D) rows; returns their ids (N,) BEFORE the move (as k-means assigns
        first, then updates)."""
        x = F.normalize(x.detach().float(), dim=1)
        self._seed_empty(x)
        ids = self.assign(x)
        k = len(self.centroids)
        sums = torch.zeros(k, x.shape[1], device=x.device).index_add_(0, ids, x)
        n = torch.bincount(ids, minlength=k)
        hit = n > 0
        self.counts += n
        rate = torch.clamp(n.float() / self.counts.clamp(min=1).float(), min=self.min_rate)
        means = sums / n.clamp(min=1)[:, None].float()
        moved = self.centroids + rate[:, None] * (means - self.centroids)
        self.centroids.copy_(torch.where(hit[:, None], F.normalize(moved, dim=1), self.centroids))
        return ids

    @torch.no_grad()
    def _seed_empty(self, x: torch.Tensor) -> None:
        filled, k = int(self.filled), len(self.centroids)
        if filled >= k:
            return
        chosen = self.centroids[:filled].clone()
        for _ in range(min(k - filled, len(x))):
            if len(chosen) == 0:
                pick = 0
            else:  # the row farthest (lowest best cosine) from every centroid set so far
                pick = int((x @ chosen.T).max(dim=1).values.argmin())
            chosen = torch.cat([chosen, x[pick:pick + 1]])
        self.centroids[:len(chosen)] = chosen
        self.filled.fill_(len(chosen))
