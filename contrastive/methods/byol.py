"""BYOL (Grill et al., 2020, "Bootstrap Your Own Latent"): a method without negatives."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from contrastive.errors import ConfigError
from contrastive.methods.hex import STRICT
from contrastive.methods.base import ContrastiveMethod


@dataclass(frozen=True)
class ByolSettings:
    """The ``method.byol`` section: the target network's base EMA rate tau_base in [0, 1) (the paper: 0.996; tau
    rises to 1 on a cosine schedule) and the predictor's hidden width (the paper: 4096 for a 256-d projection)."""

    __pydantic_config__ = STRICT
    tau_base: float = 0.996
    predictor_hidden: int = 256

    def __post_init__(self):
        if not 0.0 <= self.tau_base < 1.0:
            raise ConfigError(f"method.byol.tau_base must be in [0, 1) (got {self.tau_base}); BYOL uses 0.996, "
                              "short runs 0.99")
        if self.predictor_hidden < 1:
            raise ConfigError(f"method.byol.predictor_hidden must be >= 1 (got {self.predictor_hidden})")


def ema_tau(*, tau_base: float, step: int, total_steps: int | None) -> float:
    """BYOL's schedule (section 3.2): tau_k = 1 - (1 - tau_base) (cos(pi k / K) + 1) / 2, from tau_base at k = 0
    to 1 at k = K (K = total_steps; tau_base throughout while K is unknown)."""
    if not total_steps:
        return tau_base
    progress = min(int(step), total_steps) / total_steps  # int(): the engine passes a 0-dim tensor
    return 1.0 - (1.0 - tau_base) * (math.cos(math.pi * progress) + 1.0) / 2.0


def regression_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """BYOL eq. 2 per sample: ||q/|q| - z'/|z'|||^2 = 2 - 2 cos(q, z'); prediction, target (B, D) -> (B,)."""
    return 2.0 - 2.0 * F.cosine_similarity(prediction, target.detach(), dim=1)


class BYOL(ContrastiveMethod):
    """Online network: backbone f_theta, projector g_theta (``head``), predictor q_theta; target network: f_xi,
    g_xi, an exponential moving average of the online one that gets no gradient.

    Loss (BYOL eq. 2 and its symmetrisation), averaged over the batch:
        L = (2 - 2 cos(q(g(f(v1))), g_xi(f_xi(v2)))) + (2 - 2 cos(q(g(f(v2))), g_xi(f_xi(v1)))).
    After each optimizer step xi <- tau xi + (1 - tau) theta with :func:`ema_tau`'s cosine schedule. The target
    network is a submodule (parameters without gradient, and its batch-norm statistics), so ``state_dict`` and a
    checkpoint carry it and a resume continues from the same target.

    No negatives: nothing in the loss pushes two samples apart, so MCL's cluster-pure batches change only which
    samples share BatchNorm statistics in a step, not what any loss term compares (docs/methods.md).
    """

    def __init__(self, *, backbone: nn.Module, head: nn.Module, predictor: nn.Module, tau_base: float):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.predictor = predictor
        self.target_backbone = copy.deepcopy(backbone)
        self.target_head = copy.deepcopy(head)
        for parameter in self.target_parameters():
            parameter.requires_grad_(False)
        self.tau_base = tau_base

    def online_parameters(self) -> list[nn.Parameter]:
        return [*self.backbone.parameters(), *self.head.parameters()]

    def target_parameters(self) -> list[nn.Parameter]:
        return [*self.target_backbone.parameters(), *self.target_head.parameters()]

    def training_loss(self, view1, view2, *, step: int, groups: torch.Tensor | None = None):
        # Both views in one forward per network: BatchNorm sees the 2B batch, as BYOL's implementation.
        both = torch.cat([view1, view2])
        p1, p2 = self.predictor(self.head(self.backbone(both))).chunk(2)
        with torch.no_grad():
            z1, z2 = self.target_head(self.target_backbone(both)).chunk(2)
        loss = (regression_loss(p1, z2) + regression_loss(p2, z1)).mean()
        return loss, {"byol/tau": ema_tau(tau_base=self.tau_base, step=step, total_steps=self.total_steps)}

    @torch.no_grad()
    def after_optimizer_step(self, *, step: int) -> None:
        """xi <- tau_k xi + (1 - tau_k) theta (BYOL eq. 1), tau_k from :func:`ema_tau` at this step."""
        tau = ema_tau(tau_base=self.tau_base, step=step, total_steps=self.total_steps)
        for target, online in zip(self.target_parameters(), self.online_parameters()):
            target.mul_(tau).add_(online.detach(), alpha=1.0 - tau)
