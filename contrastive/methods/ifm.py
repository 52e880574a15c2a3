"""IFM: implicit feature modification (Robinson et al., 2021, "Can contrastive learning avoid shortcut
solutions?"), a baseline of the MCL paper (Table 2).

IFM perturbs the embeddings adversarially in the direction that makes the instance discrimination task harder. For
L2-normalised embeddings and the InfoNCE loss the worst perturbation within a budget epsilon has a closed form
(their Sec. 4): every positive similarity drops by epsilon and every negative similarity rises by epsilon, so

    l_eps(i) = -log( exp((s_i+ - eps) / tau) / ( exp((s_i+ - eps) / tau) + sum_{k != i, i+} exp((s_ik + eps) / tau) ) )

and the training loss is the plain loss averaged with it: L = (L_0 + alpha * L_eps) / 2 (alpha = 1 in the paper's
experiments).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from contrastive.engine.distributed import gather_with_grad
from contrastive.errors import ConfigError
from contrastive.methods.hex import STRICT
from contrastive.methods.losses import nt_xent
from contrastive.methods.simclr import SimCLR


@dataclass(frozen=True)
class IfmSettings:
    """The ``method.ifm`` section: the latent-space budget epsilon (IFM uses 0.05-0.2; 0.1 for SimCLR) and the
    weight alpha of the perturbed loss in (L + alpha L_eps) / 2."""

    __pydantic_config__ = STRICT
    epsilon: float = 0.1
    alpha: float = 1.0

    def __post_init__(self):
        if self.epsilon < 0:
            raise ConfigError(f"method.ifm.epsilon must be >= 0 (got {self.epsilon}); IFM uses 0.05-0.2")
        if self.alpha < 0:
            raise ConfigError(f"method.ifm.alpha must be >= 0 (got {self.alpha})")


def ifm_nt_xent(*, z1: torch.Tensor, z2: torch.Tensor, temperature: float, epsilon: float) -> torch.Tensor:
    """NT-Xent with IFM's adversarial margin: positive cosine - epsilon, negative cosines + epsilon (module
    docstring). z1, z2: (B, D) projections of two views; averaged over the 2B anchors. epsilon = 0 is ``nt_xent``."""
    batch = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2], dim=0), dim=1)
    sims = z @ z.T
    positives = torch.cat([torch.arange(batch, 2 * batch), torch.arange(0, batch)]).to(z.device)
    is_positive = F.one_hot(positives, num_classes=2 * batch).bool()
    logits = (sims + torch.where(is_positive, -epsilon, epsilon)) / temperature
    logits = logits.masked_fill(torch.eye(2 * batch, dtype=torch.bool, device=z.device), float("-inf"))
    return F.cross_entropy(logits, positives)


class IfmSimCLR(SimCLR):
    """SimCLR trained with IFM's loss (module docstring); everything else (backbone, head, views) as SimCLR."""

    def __init__(self, *, backbone, head, temperature: float, settings: IfmSettings):
        super().__init__(backbone=backbone, head=head, temperature=temperature)
        self.settings = settings

    def training_loss(self, view1, view2, *, step: int, groups: torch.Tensor | None = None):
        z1, z2 = self(torch.cat([view1, view2])).chunk(2)
        z1, z2 = gather_with_grad(z1), gather_with_grad(z2)
        plain = nt_xent(z1=z1, z2=z2, temperature=self.temperature)
        perturbed = ifm_nt_xent(z1=z1, z2=z2, temperature=self.temperature, epsilon=self.settings.epsilon)
        loss = (plain + self.settings.alpha * perturbed) / 2
        return loss, {"ifm/plain_loss": plain.detach(), "ifm/perturbed_loss": perturbed.detach()}
