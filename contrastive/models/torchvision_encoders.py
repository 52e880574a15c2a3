"""torchvision's ResNets and ViT as encoders (``contrastive.models.encoders`` builds them): a module of their own
because importing torchvision costs about 2 s, which every command that never builds a ResNet or a ViT (``mclpipe
presets``, a small_cnn pipeline, the text and embeddings modalities) should not pay.
"""
from __future__ import annotations

import contextlib
import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet
from torchvision.models.vision_transformer import VisionTransformer

BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


@contextlib.contextmanager
def _frozen_batch_stats(module: nn.Module):
    """While a checkpointed segment is recomputed in the backward pass its batch-norm layers normalise with the
    batch statistics as in the forward pass but do not update their running statistics a second time: momentum 0
    keeps them (1 * running + 0 * batch, exact), and the batch counter is restored. (Leaving the running stats out
    of the call instead would save different tensors for the backward pass than the forward did.)"""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    saved = [(m.momentum, None if m.num_batches_tracked is None else m.num_batches_tracked.clone()) for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, (momentum, count) in zip(norms, saved):
            m.momentum = momentum
            if count is not None:
                m.num_batches_tracked.copy_(count)


def _checkpointed(segment: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return checkpoint(segment, x, use_reentrant=False,
                      context_fn=lambda: (contextlib.nullcontext(), _frozen_batch_stats(segment)))


class ResNetEncoder(ResNet):
    """torchvision's ResNet without ``fc`` (output: the pooled features, (B, out_dim)); the same modules and
    parameter names as ``torchvision.models.resnetNN``, so its state dicts are interchangeable."""

    grad_checkpointing: bool = False

    def _forward_impl(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        recompute = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = _checkpointed(layer, x) if recompute else layer(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet(*, block: str, layers: list[int], stem: str = "cifar", in_channels: int = 3,
           grad_checkpointing: bool = False) -> ResNetEncoder:
    """A ResNet of ``block`` ("basic" or "bottleneck") with ``layers`` blocks per stage, from scratch; the names,
    stems and output widths are ``contrastive.models.encoders.resnet``'s, which checks them and calls this."""
    net = ResNetEncoder(BLOCKS[block], layers)
    if stem == "cifar":
        net.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    elif in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision's conv1
    net.out_dim = net.fc.in_features
    net.fc = nn.Identity()
    net.grad_checkpointing = grad_checkpointing
    return net


class ViTEncoder(VisionTransformer):
    """torchvision's VisionTransformer without its classification head: input (B, in_channels, S, S) with S =
    ``image_size``, output the final class token (B, width)."""

    grad_checkpointing: bool = False

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self._process_input(images)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        encoder = self.encoder
        x = encoder.dropout(x + encoder.pos_embedding)
        recompute = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        for block in encoder.layers:
            x = _checkpointed(block, x) if recompute else block(x)
        return self.heads(encoder.ln(x)[:, 0])


def vit(*, image_size: int, patch_size: int, depth: int, width: int, heads: int, mlp_width: int,
        in_channels: int = 3, grad_checkpointing: bool = False) -> ViTEncoder:
    """A ViT from scratch (no dropout, as torchvision's defaults); output (B, width)."""
    if image_size % patch_size:
        raise ValueError(f"ViT image size {image_size} is not a multiple of the patch size {patch_size}")
    if width % heads:
        raise ValueError(f"ViT width {width} is not a multiple of the number of heads {heads}")
    net = ViTEncoder(image_size=image_size, patch_size=patch_size, num_layers=depth, num_heads=heads,
                     hidden_dim=width, mlp_dim=mlp_width, num_classes=1)
    if in_channels != 3:
        net.conv_proj = nn.Conv2d(in_channels, width, kernel_size=patch_size, stride=patch_size)
        nn.init.trunc_normal_(net.conv_proj.weight, std=math.sqrt(1 / (in_channels * patch_size ** 2)))
        nn.init.zeros_(net.conv_proj.bias)
    net.heads = nn.Identity()
    net.out_dim = width
    net.grad_checkpointing = grad_checkpointing
    return net
