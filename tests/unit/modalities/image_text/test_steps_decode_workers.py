"""A CLIP stage reads the same: 0 and 4 decode worker processes give the same batches, loss curve and weights (each sample's
augmentation is drawn from (seed, epoch, key), the order is the reader's); the reader tokenises the captions off
the training thread and the step takes its tokens."""
import dataclasses
import json

import torch

from contrastive.data.loading import default_workers
from contrastive.modalities.image_text.adapter import ClipTask
from contrastive.modalities.image_text.data import ClipBatch, ready_for_step, write_tiny_shards
from contrastive.modalities.image_text.model import TINY_MODEL, ClipSpec, create_clip
from contrastive.modalities.image_text.steps import train_stage
from tests.unit.modalities.image_text.test_stage_ddp import _spec


def test_zero_and_four_decode_workers_train_the_same(tmp_path):
    shards = write_tiny_shards(directory=tmp_path / "shards", num_samples=48, samples_per_shard=8, seed=3)
    runs = {}
    for threads in (0, 4):
        stage = tmp_path / f"threads{threads}"
        train_stage(dataclasses.replace(_spec(stage, urls=shards["urls"]), decode_workers=threads))
        runs[threads] = json.loads((stage / "keys_rank0.json").read_text())
    assert runs[0]["batches"] == runs[4]["batches"] and len(runs[0]["batches"]) == 6
    assert runs[0]["losses"] == runs[4]["losses"]


def test_the_reader_tokenises_and_the_step_takes_its_tokens():
    bundle = create_clip(spec=ClipSpec(model_name=TINY_MODEL, init_seed=0, trainable_image_blocks=1), device="cpu")
    batch = ClipBatch(images=torch.zeros(2, 3, 32, 32), texts=["a red circle", "a blue square"], keys=["a", "b"])
    ready = ready_for_step(batch, tokenizer=bundle.tokenizer, pin_memory=False)
    assert torch.equal(ready.tokens, bundle.tokenizer(batch.texts))
    task = ClipTask(bundle=bundle)
    task.tokenizer = lambda texts: (_ for _ in ()).throw(AssertionError("tokenised again in the step"))
    assert torch.equal(task.inputs(ready, device=torch.device("cpu"), step=0)["tokens"], ready.tokens)
    assert torch.equal(ready.take(1).tokens, ready.tokens[:1])


def test_the_config_leaves_decode_workers_to_the_rule():
    from pipeline_config.loader import load_config
    config = load_config("clip_tiny")
    assert config.data.decode_workers is None and default_workers() >= 1


def test_uint8_batches_reach_the_step_as_the_same_floats_normalised_here_or_in_the_step(tmp_path):
    """A GPU stage leaves the uint8 images to the step (normalised on the device), a CPU stage has the reading thread
    normalise them: the model gets the same floats, equal to the float transform's."""
    from contrastive.data.skips import SkipCounter
    from contrastive.modalities.image_text.data import stream_batches

    bundle = create_clip(spec=ClipSpec(model_name=TINY_MODEL, init_seed=0, trainable_image_blocks=1), device="cpu")
    shards = write_tiny_shards(directory=tmp_path / "shards", num_samples=16, samples_per_shard=8, seed=3,
                               corrupt=False)

    def first(uint8: bool) -> ClipBatch:
        return next(stream_batches(urls=shards["urls"], batch_size=8, transform=bundle.train_transform, seed=0,
                                   counter=SkipCounter(max_skip_fraction=0.5), epoch=1, uint8=uint8))

    floats, task = first(False), ClipTask(bundle=bundle)
    on_device = ready_for_step(first(True), tokenizer=bundle.tokenizer, pin_memory=False, normalize=False)
    here = ready_for_step(first(True), tokenizer=bundle.tokenizer, pin_memory=False, normalize=True)
    assert on_device.images.dtype == torch.uint8 and here.images.dtype == torch.float32
    cpu = torch.device("cpu")
    assert torch.equal(task.inputs(on_device, device=cpu, step=0)["images"], floats.images)
    assert torch.equal(task.inputs(here, device=cpu, step=0)["images"], floats.images)
