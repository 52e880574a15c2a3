"""AMDIM (Bachman et al., 2019) and the feature-map NCE it shares with YADIM (framework paper, sections 2.1, 3).

A view's representation is a set of feature maps, one per scale s in {1, 5, 7} (s x s locations each, D channels;
with the ``patches`` augmentation every patch adds its s x s locations, so a map is (B, L, D) with L = patches x
s^2). A comparison (j : k) takes every location of view a's map j as an anchor, the locations of view b's map k of
the same image as its positives and those of every other image as its negatives, and the reverse direction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from contrastive.engine.distributed import gather_with_grad
from contrastive.engine.precision import fp32_logits
from contrastive.errors import ConfigError
from contrastive.methods.hex import STRICT
from contrastive.methods.base import ContrastiveMethod
from contrastive.methods.parts import MethodParts, cut_patches
from contrastive.models.amdim_encoder import SCALES

#: The representation-extraction strategies of the framework paper's Table 2 as (anchor map : target map) pairs.
#: The paper's (j : k) with j = -1 the last map: -1 = 1x1, -2 = 5x5, -3 = 7x7.
COMPARISONS = {
    "multiscale": ((1, 5), (1, 7), (5, 5)),  # AMDIM: (-1:-2) + (-1:-3) + (-2:-2)
    "last": ((1, 1),),  # YADIM: (-1:-1)
    "same_level": ((1, 1), (5, 5), (7, 7)),  # (-1:-1) + (-2:-2) + (-3:-3)
}


@dataclass(frozen=True)
class AmdimSettings:
    """The ``method.amdim`` section: the AMDIM encoder's input side for whole views (``image_size``: the data's
    image side; with the ``patches`` augmentation the encoder takes ``method.patches.size`` instead), its size
    (``width`` channels after the stem, growing to 4 x width; ``rkhs_dim`` channels of the compared maps and of
    the exported representation; ``depth`` residual blocks per stage) and the NCE's score regularisation: scores
    are clipped to c tanh(s / c) with c = ``tclip`` (AMDIM: 20) and lambda mean(s^2) with lambda =
    ``score_penalty`` (AMDIM: 0.05) is added to the loss."""

    __pydantic_config__ = STRICT
    image_size: int = 32
    width: int = 32
    rkhs_dim: int = 256
    depth: int = 1
    tclip: float = 20.0
    score_penalty: float = 0.05

    def __post_init__(self):
        if min(self.width, self.rkhs_dim, self.depth) < 1:
            raise ConfigError(f"method.amdim.width, rkhs_dim and depth must be >= 1 (got {self.width}, "
                              f"{self.rkhs_dim}, {self.depth})")
        if not self.tclip > 0 or self.score_penalty < 0:
            raise ConfigError(f"method.amdim.tclip must be > 0 and score_penalty >= 0 (got {self.tclip}, "
                              f"{self.score_penalty}); AMDIM uses 20 and 0.05")


@fp32_logits
def amdim_nce(anchors: torch.Tensor, targets: torch.Tensor, *, tclip: float,
              score_penalty: float) -> tuple[torch.Tensor, torch.Tensor]:
    """AMDIM's NCE of one comparison direction (framework paper eq. 1 with the released code's regularisation).

    anchors (B, La, D), targets (B, Lt, D). Scores s[i, a, j, t] = anchors[i, a] . targets[j, t] / sqrt(D) (dot
    product, scaled as the released code). Regulariser: score_penalty * mean(s^2) over all scores. Clipped
    scores c = tclip * tanh(s / tclip). For every anchor (i, a) and positive location t of the same image:
        l[i, a, t] = -log( exp(c[i,a,i,t]) / (exp(c[i,a,i,t]) + sum_{j != i, t'} exp(c[i,a,j,t'])) ),
    NCE = mean of l. Averaging over the anchor locations replaces the released code's one random anchor location
    (the same expectation, less variance). Returns (NCE, regulariser)."""
    batch, dim = anchors.shape[0], anchors.shape[-1]
    scores = torch.einsum("iad,jtd->iajt", anchors.float(), targets.float()) / math.sqrt(dim)
    penalty = score_penalty * scores.pow(2).mean()
    clipped = tclip * torch.tanh(scores / tclip)
    same = torch.eye(batch, dtype=torch.bool, device=anchors.device)
    positives = clipped.diagonal(dim1=0, dim2=2).permute(2, 0, 1)  # (B, La, Lt): [i, a, t] = c[i, a, i, t]
    negatives = clipped.masked_fill(same.view(batch, 1, batch, 1), float("-inf")).flatten(2)  # (B, La, B*Lt)
    negative_lse = torch.logsumexp(negatives, dim=2, keepdim=True)  # (B, La, 1)
    losses = torch.logaddexp(positives, negative_lse) - positives
    return losses.mean(), penalty


def view_maps(encoder: nn.Module, images: torch.Tensor, *, patches: tuple[int, int] | None,
              scales: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """A view's feature maps as location sets: {s: (B, L_s, D)} for the requested scales.

    encoder: an AMDIM encoder (``feature_maps``) or any backbone (only scale 1: its pooled vector). patches:
    (size, stride) to encode every patch separately (L_s = patches x s^2) or None (the whole view)."""
    batch = images.shape[0]
    if patches is not None:
        cut = cut_patches(images, size=patches[0], stride=patches[1])  # (B, P, P, C, q, q)
        images = cut.flatten(0, 2)
    if hasattr(encoder, "feature_maps"):
        maps = encoder.feature_maps(images)
        return {s: maps[s].flatten(2).transpose(1, 2).reshape(batch, -1, maps[s].shape[1]) for s in scales}
    if set(scales) != {1}:
        raise ConfigError("multi-scale comparisons need the amdim encoder: set method.parts.encoder=amdim")
    return {1: encoder(images).reshape(batch, -1, encoder.out_dim)}


class FeatureMapNCE(ContrastiveMethod):
    """AMDIM and YADIM: NCE between the feature maps of two views (framework paper eq. 2):
        L = mean over comparisons (j : k) of [ NCE(M_j^a, M_k^b) + NCE(M_j^b, M_k^a) ] / 2 + the score penalties,
    with (j : k) from :data:`COMPARISONS` for ``parts.extraction`` (``last_random``: (1 : k), k drawn uniformly
    from {1, 5, 7} each step by a generator seeded with the step, so a resumed run draws the same k).

    Parts: augmentation ``views`` or ``patches`` (``patches`` = (size, stride)); encoder ``amdim`` or
    ``backbone`` (with ``last`` only: a backbone has no 5x5 / 7x7 maps); similarity ``dot``; loss ``nce``.
    ``embed``: the 1x1 map (B, D), averaged over the patches with ``patches``.
    """

    def __init__(self, *, backbone: nn.Module, parts: MethodParts, settings: AmdimSettings,
                 patches: tuple[int, int] | None):
        super().__init__()
        if parts.extraction not in (*COMPARISONS, "last_random"):
            raise ConfigError(f"feature-map NCE needs extraction multiscale, last, last_random or same_level, "
                              f"got {parts.extraction}")
        self.backbone = backbone
        self.parts = parts
        self.tclip = settings.tclip
        self.score_penalty = settings.score_penalty
        self.patches = patches

    def comparisons(self, step: int) -> tuple[tuple[int, int], ...]:
        if self.parts.extraction == "last_random":
            draw = torch.randint(len(SCALES), (1,), generator=torch.Generator().manual_seed(int(step)))
            return ((1, SCALES[int(draw)]),)  # step: an int or the engine's 0-dim tensor
        return COMPARISONS[self.parts.extraction]

    def training_loss(self, view1, view2, *, step: int, groups: torch.Tensor | None = None):
        comparisons = self.comparisons(step)
        scales = tuple(sorted({s for pair in comparisons for s in pair}))
        if self.parts.extraction == "last_random":  # every map, so every parameter gets a gradient (DDP)
            scales = getattr(self.backbone, "scales", scales)
        # Both views in one forward (no batch statistics in the amdim encoder, so this only saves a call).
        both = view_maps(self.backbone, torch.cat([view1, view2]), patches=self.patches, scales=scales)
        # Every rank's images are negatives (identity on one process), as SimCLR's and the paper's distributed
        # softmax.
        maps_a = {s: gather_with_grad(m.chunk(2)[0]) for s, m in both.items()}
        maps_b = {s: gather_with_grad(m.chunk(2)[1]) for s, m in both.items()}
        nce_total, penalty_total = 0.0, 0.0
        for j, k in comparisons:
            for anchors, targets in ((maps_a[j], maps_b[k]), (maps_b[j], maps_a[k])):
                nce, penalty = amdim_nce(anchors, targets, tclip=self.tclip, score_penalty=self.score_penalty)
                nce_total, penalty_total = nce_total + nce, penalty_total + penalty
        unused = [m for s, m in maps_a.items() if all(s not in pair for pair in comparisons)]
        nce_total = nce_total + sum(0.0 * m.sum() for m in unused)  # zero, but a gradient path for DDP
        count = 2 * len(comparisons)
        nce, penalty = nce_total / count, penalty_total / count
        return nce + penalty, {"amdim/nce": nce.detach(), "amdim/score_penalty": penalty.detach()}

    @torch.no_grad()
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        return view_maps(self.backbone, images, patches=self.patches, scales=(1,))[1].mean(dim=1)
