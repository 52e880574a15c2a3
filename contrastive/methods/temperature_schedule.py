"""TS: the cosine temperature schedule of Kukleva et al. (2023), "Temperature schedules for self-supervised
contrastive methods on long-tail data", a baseline of the MCL paper (Table 2, range [0.1, 1]).

The temperature of SimCLR's loss follows (their eq. 3, with the period T given as ``cycles`` periods per run)

    tau(t) = tau_min + (tau_max - tau_min) * (1 + cos(2 pi * cycles * t / T_total)) / 2,

starting at tau_max (t = 0), reaching tau_min half a period later; t is the optimizer step, T_total the run's steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from contrastive.engine.distributed import gather_with_grad
from contrastive.errors import ConfigError
from contrastive.methods.hex import STRICT
from contrastive.methods.losses import nt_xent
from contrastive.methods.simclr import SimCLR


@dataclass(frozen=True)
class TsSettings:
    """The ``method.ts`` section: the temperature range and how many cosine periods the run spans."""

    __pydantic_config__ = STRICT
    tau_min: float = 0.1
    tau_max: float = 1.0
    cycles: float = 1.0

    def __post_init__(self):
        if not 0 < self.tau_min <= self.tau_max:
            raise ConfigError(f"method.ts needs 0 < tau_min <= tau_max (got {self.tau_min}, {self.tau_max}); the "
                              "MCL paper uses [0.1, 1]")
        if self.cycles <= 0:
            raise ConfigError(f"method.ts.cycles must be > 0 (got {self.cycles})")


def scheduled_temperature(*, step: int, total_steps: int, settings: TsSettings) -> float:
    """tau at optimizer step ``step`` of ``total_steps`` (module docstring)."""
    # int(step): the engine passes a 0-dim tensor; the schedule stays in Python floats, as before
    phase = 2 * math.pi * settings.cycles * int(step) / max(1, total_steps)
    return settings.tau_min + (settings.tau_max - settings.tau_min) * (1 + math.cos(phase)) / 2


class TsSimCLR(SimCLR):
    """SimCLR whose temperature follows the cosine schedule; ``method.temperature`` is unused."""

    def __init__(self, *, backbone, head, settings: TsSettings):
        super().__init__(backbone=backbone, head=head, temperature=settings.tau_max)
        self.settings = settings

    def training_loss(self, view1, view2, *, step: int, groups: torch.Tensor | None = None):
        tau = scheduled_temperature(step=step, total_steps=self.total_steps or 1, settings=self.settings)
        z1, z2 = self(torch.cat([view1, view2])).chunk(2)
        z1, z2 = gather_with_grad(z1), gather_with_grad(z2)
        return nt_xent(z1=z1, z2=z2, temperature=tau), {"ts/temperature": tau}
