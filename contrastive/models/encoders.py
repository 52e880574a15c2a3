"""Encoders and projection heads for unimodal contrastive learning."""
from __future__ import annotations

import torch
from torch import nn
from torchvision.models import resnet18


class SmallCNN(nn.Module):
    """Conv(3x3)-BN-ReLU blocks, each but the last followed by 2x2 max-pool, then global average pooling.

    Input (B, 3, H, W) float in [0, 1]; output (B, widths[-1]). With widths 32/64/128/256 it has about 0.4M
    parameters and trains at about 1,400 views/s on 2 CPU cores at 32x32 (shared/DESIGN.md section 4).
    """

    def __init__(self, *, widths: list[int]):
        super().__init__()
        layers: list[nn.Module] = []
        in_channels = 3
        for i, width in enumerate(widths):
            layers += [nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                       nn.ReLU(inplace=True)]
            if i < len(widths) - 1:
                layers.append(nn.MaxPool2d(2))
            in_channels = width
        self.features = nn.Sequential(*layers)
        self.out_dim = widths[-1]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.features(images).mean(dim=(2, 3))


def resnet18_cifar() -> nn.Module:
    """ResNet-18 with the CIFAR stem (3x3 stride-1 first conv, no max-pool); output (B, 512)."""
    net = resnet18(weights=None)
    net.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    net.fc = nn.Identity()
    net.out_dim = 512
    return net


class ProjectionHead(nn.Module):
    """SimCLR's MLP head g: (B, in_dim) -> (B, out_dim). The loss sees g(f(x)); embeddings are f(x)."""

    def __init__(self, *, in_dim: int, hidden_dim: int, out_dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.BatchNorm1d(hidden_dim), nn.ReLU(inplace=True),
                                 nn.Linear(hidden_dim, out_dim))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)


class ContrastiveModel(nn.Module):
    """Backbone f plus projection head g. ``embed`` gives the representation that is exported and evaluated."""

    def __init__(self, *, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(images))

    @torch.no_grad()
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images)


def build_model(*, encoder: str, widths: list[int], projection_hidden: int, projection_dim: int) -> ContrastiveModel:
    if encoder == "small_cnn":
        backbone = SmallCNN(widths=widths)
    elif encoder == "resnet18":
        backbone = resnet18_cifar()
    else:
        raise ValueError(f"unknown encoder {encoder!r}")
    head = ProjectionHead(in_dim=backbone.out_dim, hidden_dim=projection_hidden, out_dim=projection_dim)
    return ContrastiveModel(backbone=backbone, head=head)
