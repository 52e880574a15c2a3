"""The image modality: batches of dataset rows -> two augmented views -> a two-view method's loss.

A batch plan (``contrastive.mcl.sampler.ClusterBatchSampler``: cluster-pure batches for MCL stages >= 1, random
batches otherwise) gives this rank its rows of every global batch; the images are read as uint8 (from the
in-memory array, or decoded from files in DataLoader workers) and augmented: on a GPU in the training step, on
the CPU by a background thread a batch or two ahead of it (``contrastive.engine.prefetch``), so the augmentation
overlaps the step on another core. Every random draw of the augmentation is made for the GLOBAL batch and the
rank applies its own rows, so W ranks reproduce the crops of one process on the whole batch; the draws come from a
generator keyed by (seed, epoch, batch index), so they do not depend on when or on which thread they are made, and
a resumed stage needs no augmentation state to draw what an uninterrupted one draws.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch
from torch import nn

from contrastive.data.dataset import RowsOf
from contrastive.engine.prefetch import prefetched
from contrastive.engine.distributed import DistInfo
from contrastive.engine.task import StageTask
from contrastive.methods.base import step_input


@dataclass
class ImageBatch:
    """rows: int64 (b,) positions in the training split; images: uint8 (b, C, H, W); groups: int64 (b,) pseudo-label
    of each sample or None; ids: the samples' stable ids (a ``RowsOf`` view, read only when asked for: ``keys``);
    global_size / offset: the global batch this is a slice of
    (rows [offset, offset + b) of it); epoch / index: which batch of which epoch (the augmentation's key);
    views: the two augmented float views when they were made ahead of the step (CPU), else None."""
    rows: np.ndarray
    images: torch.Tensor
    groups: torch.Tensor | None
    ids: RowsOf | np.ndarray
    global_size: int
    offset: int
    epoch: int = 0
    index: int = 0
    views: tuple[torch.Tensor, torch.Tensor] | None = None

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def take(self, n: int) -> "ImageBatch":
        return ImageBatch(rows=self.rows[:n], images=self.images[:n],
                          groups=None if self.groups is None else self.groups[:n], ids=self.ids[:n],
                          global_size=self.global_size, offset=self.offset, epoch=self.epoch, index=self.index,
                          views=None if self.views is None else (self.views[0][:n], self.views[1][:n]))

    @property
    def keys(self) -> list[str]:
        return [str(i) for i in self.ids]


class ImageBatchSource:
    """This rank's batches of the training split, planned by ``sampler`` and read by ``read_batches``.

    read_batches(iterable of row arrays) -> iterator of (rows kept, uint8 images), in order; rows of unreadable
    images are dropped from a batch (the loop's lockstep trims the other ranks to match). prepare: work done on
    each batch by a background thread up to ``prefetch`` batches ahead of the training step (the CPU
    augmentation, ``ImageContrastiveTask.prepare``); None: batches go to the step as read.
    """

    def __init__(self, *, sampler, ids: np.ndarray, groups: np.ndarray | None,
                 read_batches: Callable[[Iterator[np.ndarray]], Iterator[tuple[np.ndarray, torch.Tensor]]],
                 info: DistInfo, prepare: Callable[[ImageBatch], ImageBatch] | None = None, prefetch: int = 2):
        self.sampler = sampler
        self.ids = ids
        self.groups = groups
        self.read_batches = read_batches
        self.info = info
        self.prepare = prepare
        self.prefetch = prefetch

    def __len__(self) -> int:
        return len(self.sampler)

    def _planned(self, *, epoch: int, start: int) -> Iterator[np.ndarray]:
        self.sampler.load_state_dict({"epoch": epoch, "batches_consumed": start})
        for batch in self.sampler:
            yield np.asarray(batch, dtype=np.int64)

    def batches(self, *, epoch: int, start: int) -> Iterator[ImageBatch]:
        read = self._read(epoch=epoch, start=start)
        return read if self.prepare is None else prefetched(read, fn=self.prepare, depth=self.prefetch)

    def _read(self, *, epoch: int, start: int) -> Iterator[ImageBatch]:
        for index, (rows, images) in enumerate(self.read_batches(self._planned(epoch=epoch, start=start)),
                                               start=start):
            local = len(rows)
            groups = None if self.groups is None else torch.from_numpy(self.groups[rows].astype(np.int64))
            # the ids only as a view: the step never reads them (a recorder of keys does), and a dataset on disk
            # would read them from its index for every batch
            yield ImageBatch(rows=rows, images=images, groups=groups, ids=RowsOf(self.ids, rows),
                             global_size=local * self.info.world_size, offset=local * self.info.rank, epoch=epoch,
                             index=index)


def augment_seed(*, seed: int, epoch: int, index: int) -> int:
    """The augmentation generator's seed for batch ``index`` of ``epoch``: a 64-bit hash of the three."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1, np.uint64)[0])


class TwoViewStep(nn.Module):
    """What DDP wraps for a two-view method: forward(view1, view2, step, groups) -> (loss, metrics)."""

    def __init__(self, method: nn.Module):
        super().__init__()
        self.method = method

    def forward(self, view1: torch.Tensor, view2: torch.Tensor, step: torch.Tensor | int,
                groups: torch.Tensor | None = None):
        return self.method.training_loss(view1, view2, step=step, groups=groups)


class ImageContrastiveTask(StageTask):
    """A two-view method (SimCLR, MoCo-v2, NNCLR, with or without HEX) on augmented images.

    method: a ``contrastive.methods.base.ContrastiveMethod``; augment(uint8 (b, C, H, W), generator, global_batch=,
    offset=) -> two float views; seed: the augmentation's seed (batch i of epoch e draws from a generator keyed by
    (seed, e, i)); epochs: the run's epochs (told to the method with the run's steps).
    """

    views_per_sample = 2

    def __init__(self, *, method: nn.Module, augment, seed: int, channels_last: bool, epochs: int | None = None):
        self.model = method
        self.epochs = epochs  # the run's epochs, for schedules counted in epochs (HEX's warm-up)
        self.augment = augment
        self.seed = seed
        self.channels_last = channels_last

    def forward_module(self) -> nn.Module:
        return TwoViewStep(self.model)

    def views(self, batch: ImageBatch, *, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The two float views (b, C, H, W) of the batch's images on ``device``."""
        images = batch.images.to(device, non_blocking=True)
        generator = torch.Generator().manual_seed(augment_seed(seed=self.seed, epoch=batch.epoch, index=batch.index))
        # Draws for the global batch, applying this rank's rows (a single process: the batch itself).
        part = {} if batch.global_size == len(batch) else {"global_batch": batch.global_size, "offset": batch.offset}
        view1, view2 = self.augment(images, generator, **part)
        if self.channels_last:
            view1, view2 = (v.contiguous(memory_format=torch.channels_last) for v in (view1, view2))
        return view1, view2

    def prepare(self, batch: ImageBatch) -> ImageBatch:
        """The CPU views made ahead of the step (on ``ImageBatchSource``'s background thread)."""
        batch.views = self.views(batch, device=torch.device("cpu"))
        return batch

    def inputs(self, batch: ImageBatch, *, device: torch.device, step: int) -> dict:
        if batch.views is not None:
            view1, view2 = (v.to(device, non_blocking=True) for v in batch.views)
        else:
            view1, view2 = self.views(batch, device=device)
        groups = None
        if batch.groups is not None and self.model.wants_groups:
            groups = batch.groups.to(device, non_blocking=True)
        return {"view1": view1, "view2": view2, "step": step_input(step), "groups": groups}

    def param_groups(self, *, weight_decay: float) -> list[dict]:
        # Every parameter decays, as in the first version (its results are the README's): Adam's default decay is
        # 1e-6. LARS leaves biases and norm layers out of decay and adaptation itself.
        return [{"params": [p for p in self.model.parameters() if p.requires_grad], "weight_decay": weight_decay}]

    def on_train_start(self, *, total_steps: int) -> None:
        self.model.on_train_start(total_steps=total_steps, epochs=self.epochs)

    def after_step(self, *, step: int) -> None:
        self.model.after_optimizer_step(step=step)
