"""AMDIM's encoder (Bachman et al., 2019, "Learning Representations by Maximizing Mutual Information Across
Views"; its released ``Encoder``), CPU-sized by default.

What the framework paper singles out (section 2.1 (2)): no padding anywhere (no padding artefacts, and each
location of a feature map sees a controlled window of the image), no batch normalisation in the trunk (no
information shared between samples of a batch; as the released code, only the compared embeddings end in batch
norm, see :class:`RkhsEmbedding`), residual blocks, and feature maps at several scales. For a side S in
:data:`SIDES` the image is brought to a 7x7 map, then 7 -> 5 -> 3 -> 1 by 3x3 valid convolutions:

    S --3x3--> S-2 --(4x4 or 2x2, stride 2)*--> 7x7 --3x3--> 5x5 --3x3--> 3x3 --3x3--> 1x1

(32 px: 30 -> 14 -> 7, as the released 32 px encoder). The 7x7, 5x5 and 1x1 maps each pass through a 1x1-conv
"RKHS" embedding with a linear shortcut (the released ``FakeRKHSConvNet``) to ``rkhs_dim`` channels, so a dot
product compares any two of them. ``forward`` returns the 1x1 map as a vector (B, rkhs_dim): the representation
that is exported, and what a method with a ``global`` extraction uses.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from contrastive.errors import ConfigError

#: Image (or patch) sides the encoder takes: S - 2 = 7 * 2^n + 2^(n+1) - 2 reaches 7x7 by stride-2 steps.
SIDES = (16, 32, 64, 128)
SCALES = (1, 5, 7)


class ConvResNxN(nn.Module):
    """Residual block without padding: h = conv1x1(relu(convNxN_stride(x))) + shortcut(x); the shortcut is an
    NxN average pool (channels zero-padded when they grow, a convolution when they shrink), as the released
    ``ConvResNxN``. Output side (S - width) // stride + 1."""

    def __init__(self, n_in: int, n_out: int, width: int, stride: int):
        super().__init__()
        self.n_in, self.n_out, self.width, self.stride = n_in, n_out, width, stride
        self.conv1 = nn.Conv2d(n_in, n_out, width, stride, 0, bias=False)
        self.conv2 = nn.Conv2d(n_out, n_out, 1, 1, 0, bias=True)
        self.shrink = nn.Conv2d(n_in, n_out, width, stride, 0, bias=True) if n_out < n_in else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv2(F.relu(self.conv1(x)))
        if self.shrink is not None:
            return h + self.shrink(x)
        shortcut = F.avg_pool2d(x, self.width, self.stride, 0)
        return h + F.pad(shortcut, (0, 0, 0, 0, 0, self.n_out - self.n_in))


class ConvResBottleneck(nn.Module):
    """1x1 residual block (the released ``ConvResBNxN`` without batch norm): x + conv(relu(conv(relu(x))))."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 1)
        self.conv2 = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.relu(self.conv1(F.relu(x))))


def _block(n_in: int, n_out: int, width: int, stride: int, depth: int) -> nn.Sequential:
    return nn.Sequential(ConvResNxN(n_in, n_out, width, stride), *[ConvResBottleneck(n_out) for _ in range(depth - 1)])


class RkhsEmbedding(nn.Module):
    """The released ``FakeRKHSConvNet``: a 1x1-conv MLP plus a linear shortcut, then batch norm,
    (B, C, h, w) -> (B, D, h, w). The released code keeps this one batch norm (``bn_out``) even in its no-batch-norm
    encoder: without it the compared embeddings start near zero and the clipped, penalised scores never grow.
    The MLP's last layer starts at zero and the shortcut near the identity, as released."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Conv2d(n_in, n_out, 1, bias=False), nn.ReLU(inplace=True),
                                 nn.Conv2d(n_out, n_out, 1, bias=False))
        self.shortcut = nn.Conv2d(n_in, n_out, 1)
        self.norm = nn.BatchNorm2d(n_out)
        nn.init.zeros_(self.mlp[2].weight)
        if n_out >= n_in:
            with torch.no_grad():
                self.shortcut.weight.uniform_(-0.01, 0.01)
                self.shortcut.weight[:, :, 0, 0].fill_diagonal_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.mlp(x) + self.shortcut(x))


class AmdimEncoder(nn.Module):
    """AMDIM's encoder for ``image_size`` x ``image_size`` inputs (one of :data:`SIDES`).

    width: channels after the stem (the released CIFAR model: 128; 320 in the ImageNet one); the maps grow to
    4 x width. rkhs_dim: channels of the compared maps and of the output (released: 1024-2560). depth: residual
    blocks per stage (released: 8-10; 1 here by default for CPU). scales: the maps :meth:`feature_maps` returns
    (1 always); only their embeddings are built, so DDP finds no parameter without a gradient.
    """

    def __init__(self, *, image_size: int, width: int, rkhs_dim: int, depth: int = 1, in_channels: int = 3,
                 scales: tuple[int, ...] = SCALES):
        super().__init__()
        if image_size not in SIDES:
            raise ConfigError(f"the amdim encoder takes images (or patches) of side {', '.join(map(str, SIDES))} "
                              f"px, got {image_size}: resize the data, or set method.patches.size to one of them")
        self.image_size = image_size
        side, channels = image_size - 2, width
        layers: list[nn.Module] = [nn.Conv2d(in_channels, width, 3, 1, 0), nn.ReLU(inplace=True),
                                   ConvResNxN(width, width, 1, 1)]
        while side > 7:
            kernel = 4 if side > 14 else 2
            grown = min(2 * channels, 4 * width)
            layers.append(_block(channels, grown, kernel, 2, depth))
            side, channels = (side - kernel) // 2 + 1, grown
        self.to7 = nn.Sequential(*layers)
        self.to5 = _block(channels, 4 * width, 3, 1, depth)
        self.to1 = nn.Sequential(_block(4 * width, 4 * width, 3, 1, depth), nn.ReLU(),
                                 ConvResNxN(4 * width, rkhs_dim, 3, 1))
        if 1 not in scales or not set(scales) <= set(SCALES):
            raise ValueError(f"amdim encoder scales must include 1 and be among {SCALES}, got {scales}")
        inputs = {7: channels, 5: 4 * width, 1: rkhs_dim}
        self.scales = tuple(sorted(scales))
        self.rkhs = nn.ModuleDict({str(s): RkhsEmbedding(inputs[s], rkhs_dim) for s in sorted(scales, reverse=True)})
        self.out_dim = rkhs_dim

    def _check_side(self, images: torch.Tensor) -> None:
        if images.shape[-1] != self.image_size or images.shape[-2] != self.image_size:
            raise ConfigError(f"the amdim encoder was built for {self.image_size} px inputs but got "
                              f"{tuple(images.shape[-2:])}: the data's image side (or method.patches.size) must be "
                              f"{self.image_size}")

    def feature_maps(self, images: torch.Tensor) -> dict[int, torch.Tensor]:
        """(B, C, S, S) -> {7: (B, D, 7, 7), 5: (B, D, 5, 5), 1: (B, D, 1, 1)} (the built ``scales``), D = rkhs_dim."""
        self._check_side(images)
        m7 = self.to7(images)
        m5 = self.to5(m7)
        m1 = self.to1(m5)
        return {s: self.rkhs[str(s)](m) for s, m in ((7, m7), (5, m5), (1, m1)) if str(s) in self.rkhs}

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, S, S) -> the 1x1 map's embedding (B, rkhs_dim); the 5x5 / 7x7 embeddings are not computed."""
        self._check_side(images)
        return self.rkhs["1"](self.to1(self.to5(self.to7(images)))).flatten(1)
