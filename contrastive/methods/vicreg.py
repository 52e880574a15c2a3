"""VICReg as a stage method (usable alone and inside MCL), with HEX as a local covariance term."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from contrastive.methods.dimension_losses import local_offdiagonal_penalty, vicreg_loss
from contrastive.errors import ConfigError
from contrastive.methods.hex import STRICT
from contrastive.methods.dimension_hex import DimensionContrastiveMethod


@dataclass(frozen=True)
class VicregSettings:
    """The ``method.vicreg`` section: the weights of invariance, variance and covariance (the paper's 25, 25, 1)
    and the variance hinge's target std gamma."""

    __pydantic_config__ = STRICT
    sim_coeff: float = 25.0
    std_coeff: float = 25.0
    cov_coeff: float = 1.0
    gamma: float = 1.0

    def __post_init__(self):
        for name in ("sim_coeff", "std_coeff", "cov_coeff", "gamma"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"method.vicreg.{name}={getattr(self, name)} must be >= 0 (the paper: 25, 25, 1, "
                                  f"gamma 1)")


class VICReg(DimensionContrastiveMethod):
    """VICReg (Bardes, Ponce & LeCun, 2022): backbone f, expander h (the projection head), loss
    :func:`contrastive.methods.dimension_losses.vicreg_loss` on h(f(x)) of two views, both views in one forward (BatchNorm
    sees the 2B batch), projections gathered across ranks so the statistics are the global batch's.

    With ``hex_rule``: L = L_VICReg + cov_coeff * Q * (1/B) sum_i [c(Z_{S_i}) + c(Z'_{S_i})], c the VICReg
    covariance term (1/D) sum_{k != l} C_kl^2 computed over S_i = {i} u H(i) and re-centred there
    (:func:`contrastive.methods.dimension_losses.local_offdiagonal_penalty`, unbiased as VICReg's C).
    """

    method_name = "vicreg"
    settings_type = VicregSettings
    settings: VicregSettings

    def training_loss(self, view1, view2, *, step: int, groups: torch.Tensor | None = None):
        z1, z2 = self.projections(view1, view2)
        s = self.settings
        loss, stats = vicreg_loss(z1=z1, z2=z2, sim_coeff=s.sim_coeff, std_coeff=s.std_coeff,
                                  cov_coeff=s.cov_coeff, gamma=s.gamma)
        if self.hex_rule is None:
            return loss, stats
        members, q, hex_stats = self.local_sets(z1=z1, z2=z2, step=step, groups=groups)
        dim = z1.shape[1]
        local = sum(local_offdiagonal_penalty(a=z, b=z, members=members, unbiased=True) for z in (z1, z2)) / dim
        term = local.mean()
        return loss + s.cov_coeff * q * term, {**stats, **hex_stats, "hex/local_term": term.detach()}
