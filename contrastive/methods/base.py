from __future__ import annotations

import torch
from torch import nn

from contrastive.methods.hex import HexRule, HexSelection
from contrastive.methods.losses import cosine_matrix


def step_input(step: int) -> torch.Tensor:
    """The optimizer step as a forward input: a 0-dim int64 CPU tensor. torch.compile guards on the value of an
    int argument a graph reads (a new value recompiles it until TorchDynamo makes it dynamic); a tensor's value is
    in no graph's guards, and a forward that never reads it (SimCLR without HEX) never waits for it. What reads it
    (HEX's schedules, AMDIM's draw, BYOL's and TS's schedules) takes ``int(step)``, on the host, outside the
    graph."""
    return torch.tensor(step, dtype=torch.int64)


class ContrastiveMethod(nn.Module):
    """A two-view method, trained by the engine through ``contrastive.modalities.image.adapter.ImageContrastiveTask``.

    Everything a method must keep across a resume (momentum encoders, queues as registered buffers) lives in its
    ``state_dict``, which the checkpoint stores.
    """

    backbone: nn.Module
    #: Set by :meth:`on_train_start`; schedules (HEX's epsilon and Q) read step / total_steps, HEX's warm-up
    #: warmup_epochs x total_steps / epochs.
    total_steps: int | None = None
    epochs: int | None = None
    hex_rule: HexRule | None = None

    def training_loss(self, view1: torch.Tensor, view2: torch.Tensor, *, step: int,
                      groups: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """view1, view2: (B, 3, H, W) two augmentations of the same B samples. groups: optional (B,) int64
        per-sample group ids (the stage's pseudo-labels, -1 = unknown), passed by the loop only to methods whose
        ``wants_groups`` is True. Returns (scalar loss, metrics to log such as {"hex/epsilon": ...})."""
        raise NotImplementedError

    def on_train_start(self, *, total_steps: int, epochs: int | None = None) -> None:
        """Called by the loop before the first step (also after a resume) with the run's total number of steps
        and of epochs."""
        self.total_steps = total_steps
        self.epochs = epochs

    def set_hex(self, hex_rule: HexRule | None, *, dim: int) -> None:
        """Use ``hex_rule``; with hierarchy = online_clusters, a codebook of the current stage's projections
        (dim D) is kept in the state (``hex_clusters``, checkpointed)."""
        from contrastive.methods.online_clusters import OnlineClusters
        self.hex_rule = hex_rule
        if hex_rule is not None and hex_rule.wants_online_clusters:
            self.hex_clusters = OnlineClusters(k=hex_rule.online.k, dim=dim, min_rate=hex_rule.online.min_rate)

    @property
    def wants_groups(self) -> bool:
        """Whether ``training_loss`` uses per-sample ``groups`` (HEX with hierarchy = earlier_clusters or
        online_clusters)."""
        return self.hex_rule is not None and self.hex_rule.wants_groups

    @torch.no_grad()
    def hex_select(self, *, anchors: torch.Tensor, candidates: torch.Tensor, negatives: torch.Tensor, step: int,
                   anchor_groups: torch.Tensor | None = None, candidate_groups: torch.Tensor | None = None,
                   learn: torch.Tensor | None = None) -> HexSelection:
        """H(i) and Q for anchors (N, D) against candidates (M, D) (negatives: (N, M) bool), by this method's rule.

        With online clusters, ``learn`` (R, D) are this step's projections the codebook learns from (once per
        step: pass it in one direction only); anchors and candidates are then assigned to the updated centroids.
        """
        anchor_clusters = candidate_clusters = None
        if self.hex_rule.wants_online_clusters:
            if learn is not None:
                self.hex_clusters.update(learn)
            anchor_clusters = self.hex_clusters.assign(anchors)
            candidate_clusters = self.hex_clusters.assign(candidates)
        return self.hex_rule.select(cosines=cosine_matrix(anchors, candidates), negatives=negatives, step=step,
                                    total_steps=self.total_steps, epochs=self.epochs, anchor_groups=anchor_groups,
                                    candidate_groups=candidate_groups, anchor_clusters=anchor_clusters,
                                    candidate_clusters=candidate_clusters)

    def after_optimizer_step(self, *, step: int) -> None:
        """Hook for updates that follow the gradient step (MoCo's momentum encoder)."""

    @torch.no_grad()
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """The representation that is exported and evaluated: backbone features (B, D)."""
        return self.backbone(images)
