"""A stage trained from image files: the same batches, augmented views and losses whatever the number of decode
workers (the augmentation is keyed by (seed, epoch, batch), the decoding by the file alone)."""
import dataclasses
import json

import numpy as np
import torch
from PIL import Image

from contrastive.data.image_decode import resample_squares

from contrastive.modalities.image.datasets.image_folder import prepare_image_folder
from contrastive.modalities.image import steps as stages
from tests.faults.train_tiny_stage import tiny_spec


def _jpeg_folder(tmp_path):
    """40 small JPEGs in 2 class folders, indexed as storage "files" (decode_scale auto, the config's default)."""
    rng = np.random.default_rng(0)
    for i in range(40):
        folder = tmp_path / "src" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (24, 20 + i % 5, 3), dtype=np.uint8)).save(folder / f"{i}.jpg")
    return prepare_image_folder(source=tmp_path / "src", root=tmp_path / "c", image_size=16, storage="files",
                                decode_scale="auto")


def _weights(stage_dir) -> dict:
    return torch.load(stage_dir / "model" / "model.pt", weights_only=True)["state_dict"]


def test_a_stage_from_files_trains_the_same_with_0_1_and_3_workers(tmp_path):
    dataset_dir = _jpeg_folder(tmp_path)
    runs = {}
    for workers in (0, 1, 3):
        spec = dataclasses.replace(tiny_spec(dataset_dir, tmp_path / f"w{workers}", epochs=2, record_keys=True),
                                   workers=workers)
        summary = stages.train_stage(spec)
        runs[workers] = json.loads((tmp_path / f"w{workers}" / "keys_rank0.json").read_text())
        assert summary["steps"] == 4  # 2 epochs of 30 training images in batches of 16 (one partial)
    assert runs[0]["batches"] == runs[1]["batches"] == runs[3]["batches"]
    assert runs[0]["losses"] == runs[1]["losses"] == runs[3]["losses"]  # the same views, bit for bit


def test_a_stage_stopped_mid_epoch_resumes_with_workers_as_if_uninterrupted(tmp_path):
    """Uninterrupted without workers; stopped after the first step (mid-epoch 0) and resumed with 2 persistent
    workers: the same final weights."""
    dataset_dir = _jpeg_folder(tmp_path)
    spec = dataclasses.replace(tiny_spec(dataset_dir, tmp_path / "full", epochs=2), workers=0)
    stages.train_stage(spec)
    resumed = dataclasses.replace(tiny_spec(dataset_dir, tmp_path / "resumed", epochs=2), workers=2)
    assert stages.train_stage(resumed, stop_after_steps=1)["steps"] == 1
    assert stages.train_stage(resumed)["steps"] == 4
    full, again = _weights(tmp_path / "full"), _weights(tmp_path / "resumed")
    assert full.keys() == again.keys() and all(torch.equal(full[k], again[k]) for k in full)


def test_resample_on_gpu_trains_on_the_workers_pixels_to_rounding(tmp_path, monkeypatch):
    """``train.resample_on_gpu`` on a CPU stage falls back to the workers: the very same losses. With CUDA patched
    in (``resample_device`` gives the stage's own device, so the reader resamples each batch on the CPU standing
    in for the GPU): the same batches, the losses to the pixels' rounding (at most a level of 255 a pixel)."""
    from contrastive.data import loading

    dataset_dir = _jpeg_folder(tmp_path)
    runs = {}

    def run(name: str, on_gpu: bool) -> None:
        spec = dataclasses.replace(tiny_spec(dataset_dir, tmp_path / name, epochs=2, record_keys=True), workers=1,
                                   resample_on_gpu=on_gpu)
        stages.train_stage(spec)
        runs[name] = json.loads((tmp_path / name / "keys_rank0.json").read_text())

    run("workers", False)
    run("fallback", True)
    assert runs["fallback"] == runs["workers"]  # the batches and the losses, bit for bit
    resampled = []
    monkeypatch.setattr(stages, "resample_device", lambda *, on_gpu, device: device if on_gpu else None)
    monkeypatch.setattr(loading, "resample_squares", lambda flat, sides, size: resampled.append(len(sides)) or
                        resample_squares(flat, sides, size=size))
    run("device", True)
    assert sum(resampled) == 60  # 2 epochs of the 30 training images, every batch resampled by the reader
    assert runs["device"]["batches"] == runs["workers"]["batches"]
    assert runs["device"]["losses"] != runs["workers"]["losses"]  # other pixels (by rounding): not the workers' path
    np.testing.assert_allclose(runs["device"]["losses"], runs["workers"]["losses"], rtol=1e-2)  # measured: 0.3 %
