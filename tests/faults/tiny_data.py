"""What the fault and launcher tests that train the tiny stage (tests/faults/train_tiny_stage.py) share: its
dataset and the weights a finished stage saved."""
from pathlib import Path

import torch

from contrastive.modalities.image.datasets.trifeature import prepare_trifeature


def tiny_trifeature(root: Path) -> Path:
    """128 training and 32 test images of 16 px, 4 colours x 4 shapes x 4 textures, seed 0, written under root."""
    return prepare_trifeature(root=root, num_train=128, num_test=32, image_size=16, num_colors=4, num_shapes=4,
                              num_textures=4, seed=0)


def stage_weights(stage_dir: Path | str) -> dict:
    """The state_dict of the model a stage saved at its end (stage_dir/model/model.pt)."""
    return torch.load(Path(stage_dir) / "model" / "model.pt", weights_only=True)["state_dict"]


def assert_same_weights(stage_dir: Path | str, expected: dict) -> None:
    """The model a stage saved equals ``expected`` (a state_dict, e.g. an uninterrupted run's) tensor by tensor."""
    got = stage_weights(stage_dir)
    for name, value in expected.items():
        assert torch.allclose(got[name].float(), value.float(), atol=1e-5), name
