"""CPC v2's context network (Henaff et al., 2019, "Data-Efficient Image Recognition with Contrastive Predictive
Coding"): a PixelCNN-style stack over the grid of patch representations in which a location sees only its own row
and the rows above it, so a prediction of the rows below cannot copy them."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RowCausalConv(nn.Module):
    """A kernel x kernel convolution whose output at row i reads input rows i - kernel + 1 .. i only: the input
    is padded with kernel - 1 rows above and none below (the masked convolution of a PixelCNN's vertical stack),
    and (kernel - 1) / 2 columns either side. (B, C, P, P) -> (B, C_out, P, P)."""

    def __init__(self, n_in: int, n_out: int, kernel: int = 3):
        super().__init__()
        if kernel % 2 == 0:
            raise ValueError(f"RowCausalConv needs an odd kernel, got {kernel}")
        self.kernel = kernel
        self.conv = nn.Conv2d(n_in, n_out, kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        side = (self.kernel - 1) // 2
        return self.conv(F.pad(x, (side, side, self.kernel - 1, 0)))


class ContextNetwork(nn.Module):
    """g_psi: ``layers`` residual blocks x + conv(relu(conv(relu(x)))) of row-causal 3x3 convolutions; context
    c_ij summarises the representations of rows <= i. (B, D, P, P) -> (B, D, P, P)."""

    def __init__(self, *, dim: int, layers: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or dim
        self.blocks = nn.ModuleList(nn.Sequential(nn.ReLU(), RowCausalConv(dim, hidden), nn.ReLU(),
                                                  RowCausalConv(hidden, dim)) for _ in range(layers))

    def forward(self, grid: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            grid = grid + block(grid)
        return grid
