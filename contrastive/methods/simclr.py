from __future__ import annotations

import torch
from torch import nn

from contrastive.losses import nt_xent
from contrastive.methods.base import ContrastiveMethod


class SimCLR(ContrastiveMethod):
    """SimCLR (Chen et al., 2020): backbone f, projection head g, NT-Xent on g(f(x)) of two views."""

    def __init__(self, *, backbone: nn.Module, head: nn.Module, temperature: float):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.temperature = temperature

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(images))

    def training_loss(self, view1, view2, *, step: int):
        # Both views in one forward: BatchNorm sees the whole 2B batch, as in SimCLR.
        z1, z2 = self(torch.cat([view1, view2])).chunk(2)
        return nt_xent(z1=z1, z2=z2, temperature=self.temperature), {}
