"""FD: feature dropout through a learned perturbation network (Tamkin et al., 2021/2022, "Viewmaker networks" and
"Feature dropout: revisiting the role of augmentations in contrastive learning"), a baseline of the MCL paper.

A small convolutional viewmaker V takes a view x (B, C, H, W) in [0, 1] and a noise channel and outputs a
perturbation delta, rescaled per image to the L1 budget (mean |delta| over pixels and channels = ``budget``,
Tamkin et al.'s distortion budget):

    delta = tanh(V([x, noise])),  delta <- delta * budget / (mean|delta| + 1e-4),  x' = clamp(x + delta, 0, 1)

The encoder minimises SimCLR's loss on (x1', x2') while the viewmaker maximises it, so it removes whichever
features the encoder currently relies on. Both are trained by the engine's one optimizer: the gradient reaching
delta is reversed (multiplied by -1), so a descent step on the viewmaker's parameters is an ascent step on the loss.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from contrastive.engine.distributed import gather_with_grad
from contrastive.errors import ConfigError
from contrastive.methods.hex import STRICT
from contrastive.methods.losses import nt_xent
from contrastive.methods.simclr import SimCLR

_EPS = 1e-4


@dataclass(frozen=True)
class FdSettings:
    """The ``method.fd`` section: the L1 budget (Tamkin et al. use 0.05) and the viewmaker's width and depth."""

    __pydantic_config__ = STRICT
    budget: float = 0.05
    width: int = 32
    blocks: int = 2

    def __post_init__(self):
        if not 0 < self.budget <= 1:
            raise ConfigError(f"method.fd.budget must be in (0, 1] (got {self.budget}); Tamkin et al. use 0.05")
        if self.width < 1 or self.blocks < 0:
            raise ConfigError(f"method.fd.width must be >= 1 and blocks >= 0 (got {self.width}, {self.blocks})")


class _ReverseGrad(torch.autograd.Function):
    """Identity forward, -grad backward: the viewmaker's descent step ascends the loss."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -grad


def reverse_grad(x: torch.Tensor) -> torch.Tensor:
    return _ReverseGrad.apply(x)


def project_l1(delta: torch.Tensor, *, budget: float) -> torch.Tensor:
    """Rescale each image's perturbation (B, C, H, W) so its mean absolute value is ``budget``."""
    magnitude = delta.abs().mean(dim=(1, 2, 3), keepdim=True)
    return delta * budget / (magnitude + _EPS)


class Viewmaker(nn.Module):
    """x (B, C, H, W) in [0, 1] -> x + delta, clamped to [0, 1], with delta within the L1 budget (module docstring).

    A 3x3 conv stem on [x, noise], ``blocks`` residual 3x3 conv blocks, a 3x3 conv to C channels.
    """

    def __init__(self, *, channels: int, settings: FdSettings):
        super().__init__()
        self.budget = settings.budget
        self.stem = nn.Conv2d(channels + 1, settings.width, 3, padding=1)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(settings.width, settings.width, 3, padding=1),
                                                  nn.BatchNorm2d(settings.width), nn.ReLU(),
                                                  nn.Conv2d(settings.width, settings.width, 3, padding=1))
                                    for _ in range(settings.blocks))
        self.out = nn.Conv2d(settings.width, channels, 3, padding=1)

    def perturbation(self, x: torch.Tensor) -> torch.Tensor:
        """delta (B, C, H, W) within the budget, before the gradient reversal."""
        noise = torch.rand(x.shape[0], 1, *x.shape[2:], device=x.device, dtype=x.dtype)
        h = F.relu(self.stem(torch.cat([x, noise], dim=1)))
        for block in self.blocks:
            h = F.relu(h + block(h))
        return project_l1(torch.tanh(self.out(h)), budget=self.budget)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + reverse_grad(self.perturbation(x))).clamp(0.0, 1.0)


class FdSimCLR(SimCLR):
    """SimCLR on viewmaker-perturbed views (module docstring); ``embed`` uses the backbone alone."""

    def __init__(self, *, backbone, head, temperature: float, channels: int, settings: FdSettings):
        super().__init__(backbone=backbone, head=head, temperature=temperature)
        self.viewmaker = Viewmaker(channels=channels, settings=settings)

    def training_loss(self, view1, view2, *, step: int, groups: torch.Tensor | None = None):
        perturbed = self.viewmaker(torch.cat([view1, view2]))
        z1, z2 = self(perturbed).chunk(2)
        z1, z2 = gather_with_grad(z1), gather_with_grad(z2)
        loss = nt_xent(z1=z1, z2=z2, temperature=self.temperature)
        return loss, {"fd/view_change": (perturbed - torch.cat([view1, view2])).abs().mean().detach()}
