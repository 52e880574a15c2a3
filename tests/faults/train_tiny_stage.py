"""Run one tiny training stage in its own process (so a test can kill -9 it). Usage: DATASET_DIR STAGE_DIR

Under ``torchrun --nproc_per_node N`` every process joins the gloo group and trains its share of each batch.
"""
import sys
import time
from pathlib import Path

from contrastive.modalities.image import steps as stages
from contrastive.engine.distributed import device_for, dist_from_env, init_process_group
from contrastive.engine.task import LoopSpec, OptimSpec


class SlowDown:
    """Gives the killing test time to act between checkpoints."""

    def on_step(self, *, step, epoch, metrics):
        time.sleep(0.05)

    def on_epoch_end(self, *, epoch, metrics):
        pass

    def on_checkpoint(self, *, path, step):
        pass


def tiny_spec(dataset_dir: Path, stage_dir: Path, *, pseudo_labels_path: Path | None = None, epochs: int = 3,
              record_keys: bool = False) -> stages.ImageStageSpec:
    return stages.ImageStageSpec(
        dataset_dir=str(dataset_dir), stage_dir=str(stage_dir),
        pseudo_labels_path=None if pseudo_labels_path is None else str(pseudo_labels_path),
        model=dict(encoder="small_cnn", widths=[8, 16], projection_hidden=16, projection_dim=8),
        method=dict(name="simclr", temperature=0.5),
        augment=dict(crop_scale=(0.3, 1.0), crop_ratio=(0.75, 1.33), hflip=False, color_jitter=0.0),
        batch_size=16, seed=7, device="cpu", remainder_policy="partial",
        optim=OptimSpec(name="adam", lr=1e-2, weight_decay=0.0, schedule="cosine", warmup_fraction=0.1),
        loop=LoopSpec(epochs=epochs, checkpoint_every_steps=1, log_every_steps=1, channels_last=True), threads=1,
        record_keys=record_keys)


def train(dataset_dir: Path, stage_dir: Path, *, slow: bool = False, stop_after_steps: int | None = None) -> dict:
    return stages.train_stage(tiny_spec(dataset_dir, stage_dir), callbacks=[SlowDown()] if slow else [],
                              stop_after_steps=stop_after_steps)


if __name__ == "__main__":
    info = dist_from_env()
    init_process_group(info=info, backend="gloo", device=device_for(name="cpu", info=info))
    stages.train_stage(tiny_spec(Path(sys.argv[1]), Path(sys.argv[2])), callbacks=[SlowDown()], info=info)
