"""Entry points of the tiny stage slowed down, for the jobs of tests that stop one mid-stage (Slurm, torchrun):
importable by every rank through PYTHONPATH or the working directory = the repo root."""
import time

from contrastive.modalities.image import steps as stages
from tests.faults.train_tiny_stage import SlowDown


def train_slow_from_json(*, spec: dict, info=None) -> dict:
    """The tiny stage, slowed down between steps so a test can cancel it mid-stage."""
    return stages.train_stage(stages.ImageStageSpec.from_json(spec), info=info, callbacks=[SlowDown()])


class Slower(SlowDown):
    """A quarter of a second a step: room to act between a node's checkpoints while two nodes train."""

    def on_step(self, *, step, epoch, metrics):
        time.sleep(0.25)


def train_slower_from_json(*, spec: dict, info=None) -> dict:
    return stages.train_stage(stages.ImageStageSpec.from_json(spec), info=info, callbacks=[Slower()])
