"""Run one tiny training stage in its own process (so a test can kill -9 it). Usage: DATASET_DIR STAGE_DIR"""
import sys
import time
from pathlib import Path

from contrastive import stages


class SlowDown:
    """Gives the killing test time to act between checkpoints."""

    def on_step(self, *, step, epoch, metrics):
        time.sleep(0.05)

    def on_epoch_end(self, *, epoch, metrics):
        pass

    def on_checkpoint(self, *, path, step):
        pass


def train(dataset_dir: Path, stage_dir: Path, *, slow: bool = False, stop_after_steps: int | None = None) -> dict:
    return stages.train_stage(
        dataset_dir=dataset_dir, stage_dir=stage_dir, pseudo_labels_path=None,
        model_kwargs=dict(encoder="small_cnn", widths=[8, 16], projection_hidden=16, projection_dim=8),
        method_kwargs=dict(name="simclr", temperature=0.5),
        augment_kwargs=dict(crop_scale=(0.3, 1.0), crop_ratio=(0.75, 1.33), hflip=False, color_jitter=0.0),
        epochs=3, batch_size=16, optimizer="adam", lr=1e-2, weight_decay=0.0, schedule="cosine",
        warmup_fraction=0.1, seed=7, device="cpu", remainder_policy="partial", checkpoint_every_steps=1,
        log_every_steps=1, threads=1, callbacks=[SlowDown()] if slow else [], stop_after_steps=stop_after_steps)


if __name__ == "__main__":
    train(Path(sys.argv[1]), Path(sys.argv[2]), slow=True)
