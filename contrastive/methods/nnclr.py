from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from contrastive.engine.distributed import gather_with_grad
from contrastive.errors import ConfigError
from contrastive.methods.hex import STRICT, HexRule
from contrastive.methods.losses import cosine_matrix, cross_view_info_nce
from contrastive.methods.base import ContrastiveMethod


@dataclass(frozen=True)
class NnclrSettings:
    """The ``method.nnclr`` section: support-set size (below the training-set size) and the predictor's width."""

    __pydantic_config__ = STRICT
    queue_size: int = 4096
    predictor_hidden: int = 256

    def __post_init__(self):
        if self.queue_size < 1 or self.predictor_hidden < 1:
            raise ConfigError(f"method.nnclr.queue_size and predictor_hidden must be >= 1 (got {self.queue_size}, "
                              f"{self.predictor_hidden})")


class NNCLR(ContrastiveMethod):
    """NNCLR (Dwibedi et al., 2021): the positive of view 1 is the nearest neighbour (cosine) of its projection in
    a support set of earlier projections, contrasted with the prediction of view 2 (NNCLR eq. 1):
        L_i = -log( exp(NN(z_i) . p+_i / tau) / sum_k exp(NN(z_i) . p+_k / tau) ),  p = predictor(z),
    symmetrised by swapping the views: L = (L(NN(z1), p2) + L(NN(z2), p1)) / 2. NN(.) carries no gradient (the
    support set is a queue of detached vectors), so the encoder learns through the prediction side.

    Support set: a FIFO queue of the first view's normalised projections, registered buffers (``support``,
    ``support_ptr``, ``support_count``) so a resume restores it. Only filled slots are searched; on the very first
    step, when it is empty, NN(z) = z (detached), i.e. a SimCLR-like step.

    With ``hex_rule``, H(i) is chosen among the in-batch negatives p+_k (k != i) of each anchor NN(z_i) (cosine
    > epsilon, or same group id as sample i) and weighted by Q.
    """

    def __init__(self, *, backbone: nn.Module, head: nn.Module, predictor: nn.Module, dim: int,
                 temperature: float, queue_size: int, hex_rule: HexRule | None = None):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.predictor = predictor
        self.temperature = temperature
        self.set_hex(hex_rule, dim=dim)
        self.register_buffer("support", torch.zeros(queue_size, dim))
        self.register_buffer("support_ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("support_count", torch.zeros((), dtype=torch.long))

    def training_loss(self, view1, view2, *, step: int, groups: torch.Tensor | None = None):
        z = self.head(self.backbone(torch.cat([view1, view2])))
        p1, p2 = self.predictor(z).chunk(2)
        z1, z2 = z.chunk(2)
        nn1, nn2 = self.nearest_neighbours(z1), self.nearest_neighbours(z2)
        # Gather after the neighbour search (each rank searches its own copy of the shared support set), before
        # choosing H(i), so every rank's predictions are negatives.
        nn1, nn2, p1, p2 = (gather_with_grad(x) for x in (nn1, nn2, p1, p2))
        groups = None if groups is None else gather_with_grad(groups)
        z_all = gather_with_grad(z.detach()) if self.hex_rule is not None else None
        loss12, stats12 = self._direction_loss(anchors=nn1, candidates=p2, step=step, groups=groups, learn=z_all)
        loss21, stats21 = self._direction_loss(anchors=nn2, candidates=p1, step=step, groups=groups)
        self.enqueue(gather_with_grad(z1.detach()))
        stats = {name: 0.5 * (stats12[name] + stats21[name]) for name in stats12}
        return 0.5 * (loss12 + loss21), stats

    def _direction_loss(self, *, anchors: torch.Tensor, candidates: torch.Tensor, step: int,
                        groups: torch.Tensor | None, learn: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, dict[str, float]]:
        if self.hex_rule is None:
            return cross_view_info_nce(anchors=anchors, candidates=candidates, temperature=self.temperature), {}
        off_diagonal = ~torch.eye(len(anchors), dtype=torch.bool, device=anchors.device)
        selection = self.hex_select(anchors=anchors, candidates=candidates, negatives=off_diagonal, step=step,
                                    anchor_groups=groups, candidate_groups=groups, learn=learn)
        loss, loss_stats = cross_view_info_nce(anchors=anchors, candidates=candidates, temperature=self.temperature,
                                               hierarchy=selection.hierarchy, q=selection.q, with_stats=True)
        return loss, {**selection.stats(), **loss_stats}

    @torch.no_grad()
    def nearest_neighbours(self, z: torch.Tensor) -> torch.Tensor:
        """(B, D) -> (B, D): the filled support-set entry of highest cosine to each row (z itself if empty)."""
        count = int(self.support_count)
        if count == 0:
            return F.normalize(z.detach(), dim=1)
        filled = self.support[:count]
        index = cosine_matrix(z, filled).argmax(dim=1)
        return filled[index].to(z.dtype)

    @torch.no_grad()
    def enqueue(self, z: torch.Tensor) -> None:
        """FIFO: write normalised z (N, D) at the pointer, wrapping around; keep only the newest K if N > K."""
        size = len(self.support)
        z = F.normalize(z[-size:].float(), dim=1)
        slots = (self.support_ptr + torch.arange(len(z), device=z.device)) % size
        self.support[slots] = z.to(self.support.dtype)
        self.support_ptr.copy_((self.support_ptr + len(z)) % size)
        self.support_count.copy_(torch.clamp(self.support_count + len(z), max=size))
