"""Barlow Twins as a stage method (usable alone and inside MCL), with HEX as a local redundancy term."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from contrastive.dimension_losses import barlow_twins_loss, local_offdiagonal_penalty, standardise
from contrastive.engine.distributed import gather_with_grad
from contrastive.errors import ConfigError
from contrastive.hex import STRICT, HexRule
from contrastive.methods.base import ContrastiveMethod
from contrastive.methods.dimension_hex import check_dimension_hex, hierarchy_sets


@dataclass(frozen=True)
class BarlowSettings:
    """The ``method.barlow`` section: lambda, the weight of the off-diagonal (redundancy) term. The paper uses
    5e-3 with D = 8192; about 1/D keeps the two terms balanced for other D."""

    __pydantic_config__ = STRICT
    lambd: float = 5e-3

    def __post_init__(self):
        if not self.lambd >= 0:
            raise ConfigError(f"method.barlow.lambd={self.lambd} must be >= 0 (the paper: 5e-3)")


class BarlowTwins(ContrastiveMethod):
    """Barlow Twins (Zbontar et al., 2021): backbone f, projector (the projection head), loss
    :func:`contrastive.dimension_losses.barlow_twins_loss` on the two views' projections standardised over the
    (global, gathered) batch.

    With ``hex_rule``: L = L_BT + lambd * Q * (1/B) sum_i sum_{k != l} (C^{S_i}_kl)^2, C^{S_i} the cross-correlation
    of the standardised views over S_i = {i} u H(i), re-centred there
    (:func:`contrastive.dimension_losses.local_offdiagonal_penalty`, 1/|S_i| as Barlow's C).
    """

    def __init__(self, *, backbone: nn.Module, head: nn.Module, dim: int, settings: BarlowSettings = BarlowSettings(),
                 hex_rule: HexRule | None = None):
        super().__init__()
        check_dimension_hex(hex_rule, method="barlow_twins")
        self.backbone = backbone
        self.head = head
        self.settings = settings
        self.set_hex(hex_rule, dim=dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(images))

    def training_loss(self, view1, view2, *, step: int, groups: torch.Tensor | None = None):
        z1, z2 = self(torch.cat([view1, view2])).float().chunk(2)
        z1, z2 = gather_with_grad(z1), gather_with_grad(z2)
        loss, stats = barlow_twins_loss(z1=z1, z2=z2, lambd=self.settings.lambd)
        if self.hex_rule is None:
            return loss, stats
        groups = None if groups is None else gather_with_grad(groups)
        members, q, hex_stats = hierarchy_sets(self, z1=z1, z2=z2, step=step, groups=groups)
        term = local_offdiagonal_penalty(a=standardise(z1), b=standardise(z2), members=members,
                                         unbiased=False).mean()
        return loss + self.settings.lambd * q * term, {**stats, **hex_stats, "hex/local_term": term.item()}
