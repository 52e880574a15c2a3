from __future__ import annotations

import torch
from torch import nn


class ContrastiveMethod(nn.Module):
    """A two-view method, trained by the engine through ``contrastive.modalities.image.ImageContrastiveTask``.

    Everything a method must keep across a resume (momentum encoders, queues as registered buffers) lives in its
    ``state_dict``, which the checkpoint stores.
    """

    backbone: nn.Module
    #: Set by :meth:`on_train_start`; schedules (HEX's epsilon and Q) read step / total_steps.
    total_steps: int | None = None

    def training_loss(self, view1: torch.Tensor, view2: torch.Tensor, *, step: int,
                      groups: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """view1, view2: (B, 3, H, W) two augmentations of the same B samples. groups: optional (B,) int64
        per-sample group ids (the stage's pseudo-labels, -1 = unknown), passed by the loop only to methods whose
        ``wants_groups`` is True. Returns (scalar loss, metrics to log such as {"hex/epsilon": ...})."""
        raise NotImplementedError

    def on_train_start(self, *, total_steps: int) -> None:
        """Called by the loop before the first step (also after a resume) with the run's total number of steps."""
        self.total_steps = total_steps

    @property
    def wants_groups(self) -> bool:
        """Whether ``training_loss`` uses per-sample ``groups`` (HEX with hierarchy = earlier_clusters)."""
        return False

    def after_optimizer_step(self, *, step: int) -> None:
        """Hook for updates that follow the gradient step (MoCo's momentum encoder)."""

    @torch.no_grad()
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """The representation that is exported and evaluated: backbone features (B, D)."""
        return self.backbone(images)
