"""The embeddings modality on the one engine: batches of feature vectors -> SimCLR's NT-Xent between two views.

A batch plan (``contrastive.mcl.sampler.ClusterBatchSampler``: cluster-pure batches for MCL stages >= 1, random
batches otherwise) gives the rows of every batch. The views are made on the host from the task's own generator
(checkpointed by the engine, so a resumed stage draws exactly what an uninterrupted one would): each view keeps
every feature with probability 1 - p (inverted dropout) and adds Gaussian noise scaled by the feature's standard
deviation over the training split.

Under DDP each rank holds its share of the global batch: the projections of all ranks are gathered with their
gradient (``contrastive.engine.distributed.gather_with_grad``) and every rank computes NT-Xent over the global
batch, so the negatives are every rank's and DDP's averaged gradient is the single-process gradient of that batch
(the engine puts batch norm over the global batch too: ``sync_batch_norms``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from torch import nn

from contrastive.engine.distributed import gather_with_grad
from contrastive.engine.task import StageTask
from contrastive.methods.losses import nt_xent


def mlp_encoder(*, in_dim: int, hidden: int, depth: int, dim: int) -> nn.Sequential:
    """(B, in_dim) -> (B, dim): ``depth`` x [Linear(hidden), BatchNorm1d, ReLU], then Linear(dim)."""
    layers: list[nn.Module] = []
    width = in_dim
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True)]
        width = hidden
    layers.append(nn.Linear(width, dim))
    return nn.Sequential(*layers)


class FeatureSimCLR(nn.Module):
    """An MLP encoder and SimCLR's projection head (Chen et al., 2020): the head is used in training only; the
    representation is the encoder's output."""

    def __init__(self, *, in_dim: int, hidden: int, depth: int, dim: int, projection_dim: int, temperature: float):
        super().__init__()
        self.encoder = mlp_encoder(in_dim=in_dim, hidden=hidden, depth=depth, dim=dim)
        self.projector = nn.Sequential(nn.ReLU(), nn.Linear(dim, projection_dim))
        self.temperature = temperature

    def forward(self, view1: torch.Tensor, view2: torch.Tensor):
        """view1, view2: (B_r, in_dim) two views of this rank's B_r vectors -> (NT-Xent loss over the global batch
        of all ranks' B = sum_r B_r vectors in rank order (B_r itself without a process group), metrics)."""
        z1 = gather_with_grad(self.projector(self.encoder(view1)))
        z2 = gather_with_grad(self.projector(self.encoder(view2)))
        loss = nt_xent(z1=z1.float(), z2=z2.float(), temperature=self.temperature)
        return loss, {}


@dataclass
class FeatureBatch:
    """rows: int64 (b,) positions in the training split; ids (b,) sample ids; features float32 (b, D)."""
    rows: np.ndarray
    ids: np.ndarray
    features: torch.Tensor

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def take(self, n: int) -> "FeatureBatch":
        return FeatureBatch(rows=self.rows[:n], ids=self.ids[:n], features=self.features[:n])

    @property
    def keys(self) -> list[str]:
        return [str(i) for i in self.ids]


class FeatureBatchSource:
    """This process's batches of the training split: ``features`` (M, D) and ``ids`` (M,) of the split, planned by
    ``sampler`` (positions in the split)."""

    def __init__(self, *, sampler, features: np.ndarray, ids: np.ndarray):
        self.sampler, self.features, self.ids = sampler, features, ids

    def __len__(self) -> int:
        return len(self.sampler)

    def batches(self, *, epoch: int, start: int) -> Iterator[FeatureBatch]:
        for rows in self.sampler.planned_rows(epoch=epoch, start=start):
            yield FeatureBatch(rows=rows, ids=self.ids[rows], features=torch.from_numpy(self.features[rows].copy()))


class FeatureViewTask(StageTask):
    """Two noisy, feature-dropped views of every vector through :class:`FeatureSimCLR`.

    feature_std: (D,) standard deviation of each feature over the training split (the noise's unit)."""

    views_per_sample = 2

    def __init__(self, *, model: FeatureSimCLR, feature_std: np.ndarray, feature_dropout: float, noise: float,
                 seed: int):
        self.model = model
        self.std = torch.as_tensor(feature_std, dtype=torch.float32)
        self.keep = 1.0 - feature_dropout
        self.noise = noise
        self.generators = {"views": torch.Generator().manual_seed(seed)}

    def forward_module(self) -> nn.Module:
        return self.model

    def view(self, features: torch.Tensor) -> torch.Tensor:
        """One random view of (b, D) features (drawn from the task's generator)."""
        draw = self.generators["views"]
        mask = (torch.rand(features.shape, generator=draw) < self.keep).float() / self.keep
        return features * mask + self.noise * self.std * torch.randn(features.shape, generator=draw)

    def inputs(self, batch: FeatureBatch, *, device: torch.device, step: int) -> dict:
        return {"view1": self.view(batch.features).to(device, non_blocking=True),
                "view2": self.view(batch.features).to(device, non_blocking=True)}
