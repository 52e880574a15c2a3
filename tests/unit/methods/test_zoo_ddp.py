"""AMDIM's and CPC v2's negatives span the global batch under DDP (gather_with_grad): two gloo ranks give the
loss curve of one process with the same global batch (augmentation drawn for the global batch, batch norm over
it)."""
import json

import numpy as np
import pytest

from contrastive.modalities.image import steps as stages
from contrastive.modalities.image.datasets.trifeature import prepare_trifeature
from contrastive.engine.distributed import DistInfo
from tests.distributed import run_gloo_ranks
from tests.unit.methods.test_zoo_stages import METHODS, _spec

WORLD = 2


def _worker(rank: int, spec_json: dict) -> None:
    stages.train_stage(stages.ImageStageSpec.from_json(spec_json), info=DistInfo(rank=rank, world_size=WORLD))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["amdim", "cpc_v2"])
def test_two_ranks_match_one_process(tmp_path, name):
    from dataclasses import replace

    dataset_dir = prepare_trifeature(root=tmp_path / "data", num_train=32, num_test=16, image_size=32, num_colors=2,
                                     num_shapes=2, num_textures=2, seed=0)
    method = METHODS[name][0]
    specs = {run: replace(_spec(dataset_dir, tmp_path / run, method), record_keys=True,
                          loop=replace(_spec(dataset_dir, tmp_path / run, method).loop, epochs=2))
             for run in ("single", "double")}
    stages.train_stage(specs["single"])
    run_gloo_ranks(_worker, specs["double"].to_json(), world=WORLD)
    single = json.loads((tmp_path / "single" / "keys_rank0.json").read_text())["losses"]
    double = json.loads((tmp_path / "double" / "keys_rank0.json").read_text())["losses"]
    assert len(single) == len(double) == 4
    # Local negatives only would start log 2 lower (8 instead of 16 images); batch norm over the global batch in
    # a different reduction order leaves float noise that Adam grows over the steps.
    assert np.allclose(single, double, rtol=2e-3)
