"""The image modality: batches of dataset rows -> two augmented views -> a two-view method's loss.

A batch plan (``contrastive.mcl.sampler.ClusterBatchSampler``: cluster-pure batches for MCL stages >= 1, random
batches otherwise) gives this rank its rows of every global batch; the images are read as uint8 (from the
in-memory array, or decoded from files in DataLoader workers), moved to the device and augmented there. Every
random draw of the augmentation is made for the GLOBAL batch and the rank applies its own rows, so W ranks
reproduce the crops of one process on the whole batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch
from torch import nn

from contrastive.engine.distributed import DistInfo
from contrastive.engine.task import StageTask


@dataclass
class ImageBatch:
    """rows: int64 (b,) positions in the training split; images: uint8 (b, C, H, W); groups: int64 (b,) pseudo-label
    of each sample or None; ids: the samples' stable ids; global_size / offset: the global batch this is a slice of
    (rows [offset, offset + b) of it)."""
    rows: np.ndarray
    images: torch.Tensor
    groups: torch.Tensor | None
    ids: np.ndarray
    global_size: int
    offset: int

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def take(self, n: int) -> "ImageBatch":
        return ImageBatch(rows=self.rows[:n], images=self.images[:n],
                          groups=None if self.groups is None else self.groups[:n], ids=self.ids[:n],
                          global_size=self.global_size, offset=self.offset)

    @property
    def keys(self) -> list[str]:
        return [str(i) for i in self.ids]


class ImageBatchSource:
    """This rank's batches of the training split, planned by ``sampler`` and read by ``read_batches``.

    read_batches(iterable of row arrays) -> iterator of (rows kept, uint8 images), in order; rows of unreadable
    images are dropped from a batch (the loop's lockstep trims the other ranks to match).
    """

    def __init__(self, *, sampler, ids: np.ndarray, groups: np.ndarray | None,
                 read_batches: Callable[[Iterator[np.ndarray]], Iterator[tuple[np.ndarray, torch.Tensor]]],
                 info: DistInfo):
        self.sampler = sampler
        self.ids = ids
        self.groups = groups
        self.read_batches = read_batches
        self.info = info

    def __len__(self) -> int:
        return len(self.sampler)

    def _planned(self, *, epoch: int, start: int) -> Iterator[np.ndarray]:
        self.sampler.load_state_dict({"epoch": epoch, "batches_consumed": start})
        for batch in self.sampler:
            yield np.asarray(batch, dtype=np.int64)

    def batches(self, *, epoch: int, start: int) -> Iterator[ImageBatch]:
        for rows, images in self.read_batches(self._planned(epoch=epoch, start=start)):
            local = len(rows)
            groups = None if self.groups is None else torch.from_numpy(self.groups[rows].astype(np.int64))
            yield ImageBatch(rows=rows, images=images, groups=groups, ids=self.ids[rows],
                             global_size=local * self.info.world_size, offset=local * self.info.rank)


class TwoViewStep(nn.Module):
    """What DDP wraps for a two-view method: forward(view1, view2, step, groups) -> (loss, metrics)."""

    def __init__(self, method: nn.Module):
        super().__init__()
        self.method = method

    def forward(self, view1: torch.Tensor, view2: torch.Tensor, step: int, groups: torch.Tensor | None = None):
        return self.method.training_loss(view1, view2, step=step, groups=groups)


class ImageContrastiveTask(StageTask):
    """A two-view method (SimCLR, MoCo-v2, NNCLR, with or without HEX) on augmented images.

    method: a ``contrastive.methods.base.ContrastiveMethod``; augment(uint8 (b, C, H, W), generator, global_batch=,
    offset=) -> two float views; seed: the augmentation generator's seed (checkpointed with the stage).
    """

    views_per_sample = 2

    def __init__(self, *, method: nn.Module, augment, seed: int, channels_last: bool):
        self.model = method
        self.augment = augment
        self.generator = torch.Generator().manual_seed(seed)
        self.generators = {"augment": self.generator}
        self.channels_last = channels_last

    def forward_module(self) -> nn.Module:
        return TwoViewStep(self.model)

    def inputs(self, batch: ImageBatch, *, device: torch.device, step: int) -> dict:
        images = batch.images.to(device, non_blocking=True)
        # Draws for the global batch, applying this rank's rows (a single process: the batch itself).
        part = {} if batch.global_size == len(batch) else {"global_batch": batch.global_size, "offset": batch.offset}
        view1, view2 = self.augment(images, self.generator, **part)
        if self.channels_last:
            view1, view2 = (v.contiguous(memory_format=torch.channels_last) for v in (view1, view2))
        groups = None
        if batch.groups is not None and self.model.wants_groups:
            groups = batch.groups.to(device)
        return {"view1": view1, "view2": view2, "step": step, "groups": groups}

    def param_groups(self, *, weight_decay: float) -> list[dict]:
        # Every parameter decays, as in the first version (its results are the README's): Adam's default decay is
        # 1e-6. LARS leaves biases and norm layers out of decay and adaptation itself.
        return [{"params": [p for p in self.model.parameters() if p.requires_grad], "weight_decay": weight_decay}]

    def on_train_start(self, *, total_steps: int) -> None:
        self.model.on_train_start(total_steps=total_steps)

    def after_step(self, *, step: int) -> None:
        self.model.after_optimizer_step(step=step)
