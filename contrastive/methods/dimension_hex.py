"""HEX for the dimension-contrastive methods (VICReg, Barlow Twins): which samples form each anchor's local
hierarchy S_i = {i} u H(i), and the scalar Q its local redundancy term is weighted with
(:mod:`contrastive.dimension_losses`)."""
from __future__ import annotations

import torch

from contrastive.errors import ConfigError
from contrastive.hex import HexRule


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
