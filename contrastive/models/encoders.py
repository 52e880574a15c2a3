"""Encoders and projection heads for unimodal contrastive learning.

``build_model`` is called with the config's ``model`` section as keyword arguments (``pipeline_config.schema.
ModelConfig``; saved models keep them as ``model_kwargs``). Every keyword added after the first version has a
default that reproduces the first version, so saved models and configs without it build identically.

Encoders (all trained from scratch, ``weights=None``):

- ``small_cnn``: :class:`SmallCNN` (CPU-sized; the default).
- ``resnet18`` / ``resnet34`` (out 512) and ``resnet50`` (out 2048): torchvision's ResNets with ``fc`` removed and
  either the CIFAR stem (3x3 stride-1 conv1, no max-pool: the default, for 32-64 px images) or the ImageNet stem
  (torchvision's 7x7 stride-2 conv1 + 3x3 stride-2 max-pool, for 224 px).
- ``vit_tiny`` / ``vit_small`` / ``vit_base``: torchvision's ``VisionTransformer`` with the classification head
  removed (output: the class token, width ``vit_width``); each ``vit_*`` keyword left None takes the preset's value.

``in_channels`` (3 by default; CIFAR-MNIST has 4) sets the first layer's input channels; ``grad_checkpointing``
recomputes each ResNet stage (``layer1``..``layer4``) or each transformer block in the backward pass instead of
keeping its activations (same outputs and gradients, less memory, about a third more compute). The modules and
parameter names do not depend on it, so a checkpoint trained with it loads without it and vice versa.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# name -> (torchvision block, blocks per stage); the modules themselves live in contrastive.models.torchvision_encoders,
# imported only when one is built.
RESNETS = {"resnet18": ("basic", [2, 2, 2, 2]), "resnet34": ("basic", [3, 4, 6, 3]),
           "resnet50": ("bottleneck", [3, 4, 6, 3])}
STEMS = ("cifar", "imagenet")


@dataclass(frozen=True)
class VitPreset:
    """A ViT's shape: image side and patch side in pixels, blocks, width, attention heads, MLP width."""
    image_size: int
    patch_size: int
    depth: int
    width: int
    heads: int
    mlp_width: int


# vit_tiny: CPU-sized, for 32 px images (64 patches of 4x4). vit_small / vit_base: DeiT-S/16 and ViT-B/16 at 224 px.
VIT_PRESETS = {
    "vit_tiny": VitPreset(image_size=32, patch_size=4, depth=4, width=192, heads=3, mlp_width=768),
    "vit_small": VitPreset(image_size=224, patch_size=16, depth=12, width=384, heads=6, mlp_width=1536),
    "vit_base": VitPreset(image_size=224, patch_size=16, depth=12, width=768, heads=12, mlp_width=3072),
}
ENCODERS = ("small_cnn", *RESNETS, *VIT_PRESETS)


class SmallCNN(nn.Module):
    """Conv(3x3)-BN-ReLU blocks, each but the last followed by 2x2 max-pool, then global average pooling.

    Input (B, in_channels, H, W) float in [0, 1]; output (B, widths[-1]). With widths 32/64/128/256 it has about
    0.4M parameters and trains at about 1,400 views/s on 2 CPU cores at 32x32 (shared/DESIGN.md section 4).
    """

    def __init__(self, *, widths: list[int], in_channels: int = 3):
        super().__init__()
        layers: list[nn.Module] = []
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


def vit_preset(encoder: str, *, image_size: int | None = None, vit_patch_size: int | None = None,
               vit_depth: int | None = None, vit_width: int | None = None, vit_heads: int | None = None,
               vit_mlp_width: int | None = None) -> VitPreset:
    """The preset named ``encoder`` with every setting that is not None replaced (mlp width: 4 x width when the
    width is changed and the mlp width is not)."""
    base = VIT_PRESETS[encoder]
    width = vit_width or base.width
    mlp = vit_mlp_width or (base.mlp_width if vit_width is None else 4 * width)
    return VitPreset(image_size=image_size or base.image_size, patch_size=vit_patch_size or base.patch_size,
                     depth=vit_depth or base.depth, width=width, heads=vit_heads or base.heads, mlp_width=mlp)


def resnet(name: str = "resnet18", *, stem: str = "cifar", in_channels: int = 3,
           grad_checkpointing: bool = False) -> nn.Module:
    """ResNet-18/34/50 from scratch; input (B, in_channels, H, W), output (B, 512) (18, 34) or (B, 2048) (50).

    stem ``cifar``: conv1 is 3x3 stride 1 and the max-pool is removed, so a 32x32 image enters layer1 at 32x32
    (the first version's ``resnet18``, built in the same order, so a seeded build gives the same weights).
    stem ``imagenet``: torchvision's 7x7 stride-2 conv1 and 3x3 stride-2 max-pool (224 px enters layer1 at 56).
    """
    if name not in RESNETS:
        raise ValueError(f"unknown resnet {name!r}: use one of {', '.join(RESNETS)}")
    if stem not in STEMS:
        raise ValueError(f"unknown stem {stem!r}: use cifar (32-64 px images) or imagenet (224 px)")
    from contrastive.models.torchvision_encoders import resnet as torchvision_resnet
    block, layers = RESNETS[name]
    return torchvision_resnet(block=block, layers=layers, stem=stem, in_channels=in_channels,
                              grad_checkpointing=grad_checkpointing)


def resnet18_cifar() -> nn.Module:
    """ResNet-18 with the CIFAR stem (3x3 stride-1 first conv, no max-pool); output (B, 512)."""
    return resnet("resnet18", stem="cifar")


def vit(*, image_size: int, patch_size: int, depth: int, width: int, heads: int, mlp_width: int,
        in_channels: int = 3, grad_checkpointing: bool = False) -> nn.Module:
    """A ViT from scratch (no dropout, as torchvision's defaults); output (B, width)."""
    from contrastive.models.torchvision_encoders import vit as torchvision_vit
    return torchvision_vit(image_size=image_size, patch_size=patch_size, depth=depth, width=width, heads=heads,
                           mlp_width=mlp_width, in_channels=in_channels, grad_checkpointing=grad_checkpointing)


def build_backbone(*, encoder: str, widths: list[int] | None = None, stem: str = "cifar", in_channels: int = 3,
                   image_size: int | None = None, vit_patch_size: int | None = None, vit_depth: int | None = None,
                   vit_width: int | None = None, vit_heads: int | None = None, vit_mlp_width: int | None = None,
                   grad_checkpointing: bool = False) -> nn.Module:
    """The encoder f named ``encoder`` (see the module docstring); it has ``out_dim``."""
    if encoder == "small_cnn":
        if widths is None:
            raise ValueError("encoder small_cnn needs widths (e.g. [32, 64, 128, 256])")
        return SmallCNN(widths=widths, in_channels=in_channels)
    if encoder in RESNETS:
        return resnet(encoder, stem=stem, in_channels=in_channels, grad_checkpointing=grad_checkpointing)
    if encoder in VIT_PRESETS:
        p = vit_preset(encoder, image_size=image_size, vit_patch_size=vit_patch_size, vit_depth=vit_depth,
                       vit_width=vit_width, vit_heads=vit_heads, vit_mlp_width=vit_mlp_width)
        return vit(image_size=p.image_size, patch_size=p.patch_size, depth=p.depth, width=p.width, heads=p.heads,
                   mlp_width=p.mlp_width, in_channels=in_channels, grad_checkpointing=grad_checkpointing)
    raise ValueError(f"unknown encoder {encoder!r}: use one of {', '.join(ENCODERS)}")


def build_model(*, encoder: str, widths: list[int] | None = None, projection_hidden: int, projection_dim: int,
                stem: str = "cifar", in_channels: int = 3, image_size: int | None = None,
                vit_patch_size: int | None = None, vit_depth: int | None = None, vit_width: int | None = None,
                vit_heads: int | None = None, vit_mlp_width: int | None = None,
                grad_checkpointing: bool = False) -> ContrastiveModel:
    """Backbone ``encoder`` + projection head (out_dim -> projection_hidden -> projection_dim). The keywords are
    ``ModelConfig``'s fields; widths is read by small_cnn only, stem by the ResNets only, image_size and vit_* by
    the ViTs only (None: the preset's value)."""
    backbone = build_backbone(encoder=encoder, widths=widths, stem=stem, in_channels=in_channels,
                              image_size=image_size, vit_patch_size=vit_patch_size, vit_depth=vit_depth,
                              vit_width=vit_width, vit_heads=vit_heads, vit_mlp_width=vit_mlp_width,
                              grad_checkpointing=grad_checkpointing)
    head = ProjectionHead(in_dim=backbone.out_dim, hidden_dim=projection_hidden, out_dim=projection_dim)
    return ContrastiveModel(backbone=backbone, head=head)
