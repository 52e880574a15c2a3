from __future__ import annotations

import torch
from torch import nn


class ContrastiveMethod(nn.Module):
    """Interface between a method and ``contrastive.train.train_contrastive``.

    Everything a method must keep across a resume (momentum encoders, queues as registered buffers) lives in its
    ``state_dict``, which the checkpoint stores.
    """

    backbone: nn.Module

    def training_loss(self, view1: torch.Tensor, view2: torch.Tensor, *, step: int
                      ) -> tuple[torch.Tensor, dict[str, float]]:
        """view1, view2: (B, 3, H, W) two augmentations of the same B samples. Returns (scalar loss, metrics
        to log such as {"hex/epsilon": ...})."""
        raise NotImplementedError

    def after_optimizer_step(self, *, step: int) -> None:
        """Hook for updates that follow the gradient step (MoCo's momentum encoder)."""

    @torch.no_grad()
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """The representation that is exported and evaluated: backbone features (B, D)."""
        return self.backbone(images)
