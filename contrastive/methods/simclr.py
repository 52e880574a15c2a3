from __future__ import annotations

import torch
from torch import nn

from contrastive.engine.distributed import gather_with_grad
from contrastive.methods.hex import HexRule
from contrastive.methods.losses import hex_info_nce, nt_xent, two_view_negatives
from contrastive.methods.base import ContrastiveMethod


class SimCLR(ContrastiveMethod):
    """SimCLR (Chen et al., 2020): backbone f, projection head g, NT-Xent on g(f(x)) of two views.

    With ``hex_rule`` (a :class:`contrastive.methods.hex.HexRule`), the loss is :func:`contrastive.methods.losses.hex_info_nce`: the
    negatives in H(i) count with weight Q in the denominator (HEX), or with the authors' hard-negative estimate;
    H(i), epsilon and Q are logged every step. dim: the projection size (needed by hierarchy = online_clusters).
    """

    def __init__(self, *, backbone: nn.Module, head: nn.Module, temperature: float,
                 hex_rule: HexRule | None = None, dim: int | None = None):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.temperature = temperature
        self.set_hex(hex_rule, dim=dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(images))

    def training_loss(self, view1, view2, *, step: int, groups: torch.Tensor | None = None):
        # Both views in one forward: BatchNorm sees the whole 2B batch, as in SimCLR.
        z1, z2 = self(torch.cat([view1, view2])).chunk(2)
        # Every rank's samples are negatives (identity on one process), with and without HEX alike, so the
        # no-HEX control sees the same negatives as the HEX run.
        z1, z2 = gather_with_grad(z1), gather_with_grad(z2)
        if self.hex_rule is None:
            return nt_xent(z1=z1, z2=z2, temperature=self.temperature), {}
        both = torch.cat([z1, z2])
        groups = None if groups is None else gather_with_grad(groups).repeat(2)
        selection = self.hex_select(anchors=both, candidates=both,
                                    negatives=two_view_negatives(len(z1), device=both.device), step=step,
                                    anchor_groups=groups, candidate_groups=groups, learn=both)
        loss, loss_stats = hex_info_nce(z1=z1, z2=z2, temperature=self.temperature, epsilon=selection.epsilon,
                                        q=selection.q, hierarchy_mask=selection.hierarchy)
        return loss, {**selection.stats(), **loss_stats}
