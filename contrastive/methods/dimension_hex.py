"""HEX for the dimension-contrastive methods (VICReg, Barlow Twins): which samples form each anchor's local
hierarchy S_i = {i} u H(i), and the scalar Q its local redundancy term is weighted with
(:mod:`contrastive.methods.dimension_losses`)."""
from __future__ import annotations

import torch
from torch import nn

from contrastive.engine.distributed import gather_with_grad
from contrastive.errors import ConfigError
from contrastive.methods.hex import HexRule
from contrastive.methods.base import ContrastiveMethod


def check_dimension_hex(hex_rule: HexRule | None, *, method: str) -> None:
    """The local term is weighted by one Q per step: per-pair Q and the hard-negative estimate (which reweights
    negatives of a softmax denominator these methods do not have) do not apply."""
    if hex_rule is None:
        return
    if hex_rule.weighting != "q":
        raise ConfigError(f"method.hex.weighting={hex_rule.weighting} does not apply to {method} (it reweights the "
                          f"negatives of an InfoNCE denominator, which {method} has not): set method.hex.weighting=q")
    if hex_rule.q.mode == "similarity":
        raise ConfigError(f"method.hex.q.mode=similarity gives one Q per pair, but {method}'s HEX term takes one Q "
                          f"per step: set method.hex.q.mode to constant or schedule")


def hierarchy_sets(method, *, z1: torch.Tensor, z2: torch.Tensor, step: int, groups: torch.Tensor | None
                   ) -> tuple[torch.Tensor, float, dict[str, float]]:
    """(members (B, B) bool with S_i in row i, Q, stats). H(i) is chosen among the other samples of the batch by
    the method's HEX rule on the first view's projections (cosine threshold, earlier clusters or online clusters,
    which learn from both views)."""
    batch = len(z1)
    others = ~torch.eye(batch, dtype=torch.bool, device=z1.device)
    selection = method.hex_select(anchors=z1, candidates=z1, negatives=others, step=step, anchor_groups=groups,
                                  candidate_groups=groups, learn=torch.cat([z1, z2]))
    members = selection.hierarchy | ~others
    return members, float(selection.q), selection.stats()


class DimensionContrastiveMethod(ContrastiveMethod):
    """What VICReg and Barlow Twins share: backbone f and projector h, both views in one forward (BatchNorm sees
    the 2B batch), projections gathered across ranks so their statistics are the global batch's, and HEX's local
    sets S_i on those gathered projections. Subclasses name ``method_name`` (for error messages), their settings
    dataclass ``settings_type`` and write ``training_loss`` from :meth:`projections` and :meth:`local_sets`."""

    method_name: str
    settings_type: type

    def __init__(self, *, backbone: nn.Module, head: nn.Module, dim: int, settings=None,
                 hex_rule: HexRule | None = None):
        super().__init__()
        check_dimension_hex(hex_rule, method=self.method_name)
        self.backbone = backbone
        self.head = head
        self.settings = self.settings_type() if settings is None else settings
        self.set_hex(hex_rule, dim=dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(images))

    def projections(self, view1: torch.Tensor, view2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(z1, z2), each (B_global, D) fp32: both (B, ...) views through h(f(.)) in one forward, gathered with
        gradients from every rank."""
        z1, z2 = self(torch.cat([view1, view2])).float().chunk(2)
        return gather_with_grad(z1), gather_with_grad(z2)

    def local_sets(self, *, z1: torch.Tensor, z2: torch.Tensor, step: int, groups: torch.Tensor | None
                   ) -> tuple[torch.Tensor, float, dict[str, float]]:
        """:func:`hierarchy_sets` with the (B,) per-rank ``groups`` gathered to match the gathered projections."""
        groups = None if groups is None else gather_with_grad(groups)
        return hierarchy_sets(self, z1=z1, z2=z2, step=step, groups=groups)
