"""Barlow Twins as a stage method (usable alone and inside MCL), with HEX as a local redundancy term."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from contrastive.methods.dimension_losses import barlow_twins_loss, local_offdiagonal_penalty, standardise
from contrastive.errors import ConfigError
from contrastive.methods.hex import STRICT
from contrastive.methods.dimension_hex import DimensionContrastiveMethod


@dataclass(frozen=True)
class BarlowSettings:
    """The ``method.barlow`` section: lambda, the weight of the off-diagonal (redundancy) term. The paper uses
    5e-3 with D = 8192; about 1/D keeps the two terms balanced for other D."""

    __pydantic_config__ = STRICT
    lambd: float = 5e-3

    def __post_init__(self):
        if not self.lambd >= 0:
            raise ConfigError(f"method.barlow.lambd={self.lambd} must be >= 0 (the paper: 5e-3)")


class BarlowTwins(DimensionContrastiveMethod):
    """Barlow Twins (Zbontar et al., 2021): backbone f, projector (the projection head), loss
    :func:`contrastive.methods.dimension_losses.barlow_twins_loss` on the two views' projections standardised over the
    (global, gathered) batch.

    With ``hex_rule``: L = L_BT + lambd * Q * (1/B) sum_i sum_{k != l} (C^{S_i}_kl)^2, C^{S_i} the cross-correlation
    of the standardised views over S_i = {i} u H(i), re-centred there
    (:func:`contrastive.methods.dimension_losses.local_offdiagonal_penalty`, 1/|S_i| as Barlow's C).
    """

    method_name = "barlow_twins"
    settings_type = BarlowSettings
    settings: BarlowSettings

    def training_loss(self, view1, view2, *, step: int, groups: torch.Tensor | None = None):
        z1, z2 = self.projections(view1, view2)
        loss, stats = barlow_twins_loss(z1=z1, z2=z2, lambd=self.settings.lambd)
        if self.hex_rule is None:
            return loss, stats
        members, q, hex_stats = self.local_sets(z1=z1, z2=z2, step=step, groups=groups)
        term = local_offdiagonal_penalty(a=standardise(z1), b=standardise(z2), members=members,
                                         unbiased=False).mean()
        return loss + self.settings.lambd * q * term, {**stats, **hex_stats, "hex/local_term": term.detach()}
