from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from contrastive.engine.distributed import gather_with_grad
from contrastive.errors import ConfigError
from contrastive.methods.hex import STRICT, HexRule
from contrastive.methods.losses import queue_info_nce
from contrastive.methods.base import ContrastiveMethod


@dataclass(frozen=True)
class MocoSettings:
    """The ``method.moco`` section: negatives kept in the queue (below the training-set size) and the key
    encoder's momentum m in [0, 1) (MoCo uses 0.99-0.999)."""

    __pydantic_config__ = STRICT
    queue_size: int = 4096
    momentum: float = 0.99

    def __post_init__(self):
        if self.queue_size < 1:
            raise ConfigError(f"method.moco.queue_size must be >= 1 (got {self.queue_size})")
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"method.moco.momentum must be in [0, 1) (got {self.momentum}); MoCo uses 0.99-0.999")


class MoCoV2(ContrastiveMethod):
    """MoCo-v2 (He et al., 2020; Chen et al., 2020): query encoder f_q = head(backbone), key encoder f_k = a
    momentum copy of it, and a FIFO queue of K earlier keys as the negatives.

    Loss (MoCo eq. 1), symmetrised over the two views:
        L = (InfoNCE(q1, k2, queue) + InfoNCE(q2, k1, queue)) / 2,  q = f_q(x) normalised, k = f_k(x') no grad.
    After each optimizer step the key encoder follows theta_k <- m theta_k + (1 - m) theta_q; after each loss the
    batch's keys (both views) replace the oldest K entries of the queue. Queue, its group ids and its pointer are
    registered buffers and the key encoder is a submodule, so a checkpoint's ``state_dict`` resumes all of it.

    With ``hex_rule``, H(i) is chosen among the queue negatives of each query (cosine > epsilon, or same group id:
    the queue remembers the group of every key it holds) and weighted by Q.

    Single-process note: MoCo's shuffling BN is not needed here because queries and keys go through different
    encoders in separate forwards, so a query never shares BatchNorm statistics with its own key.
    """

    def __init__(self, *, backbone: nn.Module, head: nn.Module, dim: int, temperature: float, queue_size: int,
                 momentum: float, hex_rule: HexRule | None = None):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.key_backbone = copy.deepcopy(backbone)
        self.key_head = copy.deepcopy(head)
        for parameter in [*self.key_backbone.parameters(), *self.key_head.parameters()]:
            parameter.requires_grad_(False)
        self.temperature = temperature
        self.momentum = momentum
        self.set_hex(hex_rule, dim=dim)
        # Random unit vectors, as in the official implementation: the first K / 2B steps see near-orthogonal
        # negatives, which cost little and need no validity mask.
        self.register_buffer("queue", F.normalize(torch.randn(queue_size, dim), dim=1))
        self.register_buffer("queue_groups", torch.full((queue_size,), -1, dtype=torch.long))
        self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long))

    def query_parameters(self) -> list[nn.Parameter]:
        return [*self.backbone.parameters(), *self.head.parameters()]

    def key_parameters(self) -> list[nn.Parameter]:
        return [*self.key_backbone.parameters(), *self.key_head.parameters()]

    def training_loss(self, view1, view2, *, step: int, groups: torch.Tensor | None = None):
        q1, q2 = F.normalize(self.head(self.backbone(torch.cat([view1, view2]))), dim=1).chunk(2)
        with torch.no_grad():
            k1, k2 = F.normalize(self.key_head(self.key_backbone(torch.cat([view1, view2]))), dim=1).chunk(2)
        learn = gather_with_grad(torch.cat([q1, q2]).detach()) if self.hex_rule is not None else None
        loss12, stats12 = self._direction_loss(query=q1, key=k2, step=step, groups=groups, learn=learn)
        loss21, stats21 = self._direction_loss(query=q2, key=k1, step=step, groups=groups)
        keys = gather_with_grad(torch.cat([k1, k2]))
        key_groups = None if groups is None else gather_with_grad(groups).repeat(2)
        self.enqueue(keys=keys, groups=key_groups)
        stats = {name: 0.5 * (stats12[name] + stats21[name]) for name in stats12}
        return 0.5 * (loss12 + loss21), stats

    def _direction_loss(self, *, query: torch.Tensor, key: torch.Tensor, step: int,
                        groups: torch.Tensor | None, learn: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, dict[str, float]]:
        """InfoNCE of queries (B, D) against their keys (B, D) and the queue (K, D) (HEX-weighted if enabled)."""
        queue = self.queue.clone().detach()
        if self.hex_rule is None:
            return queue_info_nce(query=query, key=key, queue=queue, temperature=self.temperature), {}
        every_negative = torch.ones(len(query), len(queue), dtype=torch.bool, device=query.device)
        selection = self.hex_select(anchors=query, candidates=queue, negatives=every_negative, step=step,
                                    anchor_groups=groups, candidate_groups=self.queue_groups, learn=learn)
        loss, loss_stats = queue_info_nce(query=query, key=key, queue=queue, temperature=self.temperature,
                                          hierarchy=selection.hierarchy, q=selection.q, with_stats=True)
        return loss, {**selection.stats(), **loss_stats}

    @torch.no_grad()
    def enqueue(self, *, keys: torch.Tensor, groups: torch.Tensor | None = None) -> None:
        """FIFO: write keys (N, D) at the pointer, wrapping around; keep only the newest K if N > K."""
        size = len(self.queue)
        keys = keys[-size:]
        if groups is None:
            groups = torch.full((len(keys),), -1, dtype=torch.long, device=keys.device)  # unknown: never in H
        groups = groups[-size:]
        slots = (self.queue_ptr + torch.arange(len(keys), device=keys.device)) % size
        self.queue[slots] = keys.to(self.queue.dtype)
        self.queue_groups[slots] = groups.to(self.queue_groups.device, torch.long)
        self.queue_ptr.copy_((self.queue_ptr + len(keys)) % size)

    @torch.no_grad()
    def after_optimizer_step(self, *, step: int) -> None:
        """Momentum update of the key encoder (MoCo eq. 2): theta_k <- m theta_k + (1 - m) theta_q."""
        for key_param, query_param in zip(self.key_parameters(), self.query_parameters()):
            key_param.mul_(self.momentum).add_(query_param.detach(), alpha=1.0 - self.momentum)
