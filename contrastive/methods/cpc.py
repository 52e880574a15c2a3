"""CPC v2 (Henaff et al., 2019) as the framework paper describes it (section 2.2): patches, a patch encoder, a
context network predicting the representations of the rows below, InfoNCE over the predictions."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from contrastive.engine.distributed import gather_with_grad
from contrastive.errors import ConfigError
from contrastive.methods.hex import STRICT
from contrastive.methods.base import ContrastiveMethod
from contrastive.methods.parts import cut_patches
from contrastive.models.cpc import ContextNetwork


@dataclass(frozen=True)
class CpcSettings:
    """The ``method.cpc`` section: residual blocks of the context network and how many rows below are predicted
    (k = 1 .. offsets; CPC v2 predicts up to 5 rows of a 7 x 7 grid; 2 fits the 3 x 3 grid of 32 px images)."""

    __pydantic_config__ = STRICT
    context_layers: int = 2
    offsets: int = 2

    def __post_init__(self):
        if self.context_layers < 0 or self.offsets < 1:
            raise ConfigError(f"method.cpc needs context_layers >= 0 and offsets >= 1 (got {self.context_layers}, "
                              f"{self.offsets})")


def cpc_info_nce(*, context: torch.Tensor, targets: torch.Tensor, predictors: nn.ModuleList) -> torch.Tensor:
    """InfoNCE of CPC's row predictions (framework paper eq. 3, the released ``compute_loss_h``).

    context, targets: (B, D, P, P) grids (rows i, columns j). predictors[k - 1] = W_k, a linear map D -> D (1x1
    conv). For each offset k < P the prediction of H[b, i + k, j] is W_k c[b, i, j] (rows i = 0 .. P - k - 1); its
    logits are its dot products with all B * P * P target vectors of the batch, the true one being the positive and
    all the others (the same image's other patches included) the negatives:
        L_k = mean over (b, i, j) of -log softmax(W_k c[b,i,j] . H[all])[index of (b, i + k, j)].
    Returns the mean of L_k over the offsets that fit in the grid."""
    batch, dim, rows, cols = targets.shape
    usable = min(len(predictors), rows - 1)
    if usable < 1:
        raise ConfigError(f"CPC needs a grid of at least 2 patch rows, got {rows}: lower method.patches.size or "
                          "method.patches.stride")
    flat_targets = targets.permute(0, 2, 3, 1).reshape(-1, dim)  # row-major (b, i, j)
    losses = []
    for k in range(1, usable + 1):
        predictions = predictors[k - 1](context[:, :, :rows - k, :])  # (B, D, P - k, P)
        predictions = predictions.permute(0, 2, 3, 1).reshape(-1, dim)
        b, i, j = torch.meshgrid(torch.arange(batch), torch.arange(rows - k), torch.arange(cols), indexing="ij")
        labels = (b * rows * cols + (i + k) * cols + j).reshape(-1).to(targets.device)
        losses.append(F.cross_entropy(predictions.float() @ flat_targets.float().T, labels))
    return torch.stack(losses).mean()


class CPCv2(ContrastiveMethod):
    """Each view is cut into a P x P grid of overlapping patches (``patches`` = (size, stride)); the encoder maps
    every patch to a vector, giving H (B, D, P, P); the context network gives C = g(H); :func:`cpc_info_nce`
    scores W_k C against H. Loss: the mean over the two augmented views (each its own CPC task).
    ``embed``: the patch vectors averaged over the grid, (B, D) (CPC v2's evaluation pools the grid)."""

    def __init__(self, *, backbone: nn.Module, dim: int, settings: CpcSettings, patches: tuple[int, int]):
        super().__init__()
        self.backbone = backbone
        self.context = ContextNetwork(dim=dim, layers=settings.context_layers)
        self.predictors = nn.ModuleList(nn.Conv2d(dim, dim, 1) for _ in range(settings.offsets))
        self.patches = patches

    def patch_grid(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, S, S) -> H (B, D, P, P): every patch encoded on its own."""
        cut = cut_patches(images, size=self.patches[0], stride=self.patches[1])  # (B, P, P, C, q, q)
        batch, rows, cols = cut.shape[:3]
        vectors = self.backbone(cut.flatten(0, 2))  # (B * P * P, D)
        return vectors.reshape(batch, rows, cols, -1).permute(0, 3, 1, 2)

    def training_loss(self, view1, view2, *, step: int, groups: torch.Tensor | None = None):
        grids = self.patch_grid(torch.cat([view1, view2]))
        # Every rank's patches are negatives (identity on one process); the context of an image depends on that
        # image only, so it is computed before the gather.
        losses = [cpc_info_nce(context=gather_with_grad(self.context(grid)), targets=gather_with_grad(grid),
                               predictors=self.predictors) for grid in grids.chunk(2)]
        return 0.5 * (losses[0] + losses[1]), {}

    @torch.no_grad()
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        return self.patch_grid(images).mean(dim=(2, 3))
