"""Test helper: train a two-view method on an in-memory uint8 batch through the engine, as a stage does."""
from pathlib import Path

import numpy as np
import torch

from contrastive.modalities.image.augment import TwoViewAugment
from contrastive.engine.distributed import DistInfo
from contrastive.engine.loop import TrainResult, train
from contrastive.engine.rng import seed_everything
from contrastive.engine.task import LoopSpec, OptimSpec
from contrastive.methods import build_method
from contrastive.mcl.sampler import ClusterBatchSampler
from contrastive.modalities.image.adapter import ImageBatchSource, ImageContrastiveTask

MODEL = dict(encoder="small_cnn", widths=[4, 8], projection_hidden=8, projection_dim=4)
AUGMENT = dict(crop_scale=(0.3, 1.0), crop_ratio=(0.75, 1.33), hflip=False, color_jitter=0.0)


def train_on_images(*, checkpoint_dir: Path, method_kwargs: dict, images: torch.Tensor, batch_size: int = 8,
                    plan_groups: np.ndarray | None = None, hex_groups: np.ndarray | None = None, epochs: int = 2,
                    warmup_fraction: float = 0.0, checkpoint_every_steps: int = 4,
                    stop_after_steps: int | None = None, prefetch: bool = True) -> tuple[torch.nn.Module, TrainResult]:
    """plan_groups: pseudo-labels the batches are drawn from (None: random batches); hex_groups: the groups the
    method sees (HEX with hierarchy = earlier_clusters); prefetch: augment on a background thread ahead of the
    step, as a CPU stage does (False: in the step, as on a GPU)."""
    seed_everything(0)
    method = build_method(model_kwargs=MODEL, method_kwargs=method_kwargs)
    sampler = ClusterBatchSampler(groups=plan_groups, num_samples=len(images), batch_size=batch_size, seed=0)
    task = ImageContrastiveTask(method=method, augment=TwoViewAugment(**AUGMENT), seed=0, channels_last=True,
                                epochs=epochs)
    source = ImageBatchSource(sampler=sampler, ids=np.arange(len(images)), groups=hex_groups, info=DistInfo(),
                              read_batches=lambda planned: ((rows, images[torch.from_numpy(rows)])
                                                            for rows in planned),
                              prepare=task.prepare if prefetch else None)
    result = train(task=task, source=source, optim=OptimSpec(name="adam", lr=1e-2, weight_decay=0.0,
                                                             warmup_fraction=warmup_fraction),
                   loop=LoopSpec(epochs=epochs, checkpoint_every_steps=checkpoint_every_steps, log_every_steps=1,
                                 channels_last=True),
                   device=torch.device("cpu"), checkpoint_path=checkpoint_dir / "last.pt",
                   stop_after_steps=stop_after_steps)
    return method, result
