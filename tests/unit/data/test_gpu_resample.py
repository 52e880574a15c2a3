"""``train.resample_on_gpu``: the DataLoader workers ship each JPEG's decoded centre square and the device
resamples the batch (``contrastive.data.image_decode.resample_squares``). Run here with the CPU as the device (the
device is a parameter; nothing in the path needs CUDA but the copy, which is a no-op on the CPU): the batches are
the workers' own to rounding.

The tolerance: the workers' kernel is torch's uint8 antialiased bicubic (fixed-point weights, the width pass
rounded to uint8 before the height pass); the device path does the same two passes in float32, each rounded and
clamped. They differ only by the fixed-point weights: at most 1 level of 255 down-sampling and 2 up-sampling, a
mean under 0.02 on noise (the worst case: every pixel an edge). A wrong kernel (bilinear, no antialias, the height
pass first, one pass without the rounding between) or swapped channels differs by tens of levels."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from contrastive.data.image_decode import load_square_rgb, resample_squares
from contrastive.data import loading
from contrastive.data.loading import BatchReader, iter_batches, load_dataset, resample_device
from contrastive.modalities.image.datasets.image_folder import prepare_image_folder

SIZE = 16
# (width, height) of noise JPEGs for a 16 px square: landscape and portrait decoded whole (24x20, 20x30), one at
# libjpeg-turbo's 1/2 scale (70x40 -> 35x20), one already square at 16, and two smaller than 16 (up-sampled).
SHAPES = [(24, 20), (20, 30), (70, 40), (16, 16), (12, 14), (30, 11)]


def _jpeg(width: int, height: int, seed: int) -> bytes:
    """Noise with a colour gradient (so a swap of channels shows), saved as a JPEG."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3)).astype(np.int64)
    pixels[..., 0] = (pixels[..., 0] + np.linspace(0, 255, width).astype(np.int64)) // 2
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def _pack(squares: list[np.ndarray]) -> tuple[torch.Tensor, list[int]]:
    """The squares back to back, as a worker packs them (``decode_squares``)."""
    return torch.from_numpy(np.concatenate([s.reshape(-1) for s in squares])), [s.shape[0] for s in squares]


def _assert_to_rounding(ours: torch.Tensor, workers: torch.Tensor, *, max_level: int) -> None:
    diff = (ours.to(torch.int16) - workers.to(torch.int16)).abs()
    assert ours.dtype == torch.uint8 and ours.shape == workers.shape
    assert diff.max().item() <= max_level and diff.float().mean().item() < 0.02, (diff.max(), diff.float().mean())


@pytest.mark.parametrize("device", [torch.device("cpu")])  # a GPU run passes "cuda" (bench.gpu_check's input row)
def test_the_device_resamples_a_batch_to_the_workers_pixels_to_rounding(device):
    data = [_jpeg(w, h, seed) for seed, (w, h) in enumerate(SHAPES)]
    squares = [load_square_rgb(io.BytesIO(d), size=SIZE, decode_scale="auto", resample=False) for d in data]
    assert [s.shape[0] for s in squares] == [20, 20, 20, 16, 12, 11]  # decoded squares, not yet at 16
    workers = torch.stack([torch.from_numpy(load_square_rgb(io.BytesIO(d), size=SIZE, decode_scale="auto"))
                           for d in data]).permute(0, 3, 1, 2)
    flat, sides = _pack(squares)
    ours = resample_squares(flat.to(device), sides, size=SIZE).cpu()  # mixed sides: one group a side
    _assert_to_rounding(ours[:3], workers[:3], max_level=1)  # down-sampled
    assert torch.equal(ours[3], workers[3])  # already at 16: the decoded pixels, untouched
    _assert_to_rounding(ours[4:], workers[4:], max_level=2)  # up-sampled
    # A batch of one side (the usual case: photos of one camera): the same pixels through the one-group path.
    one_side = resample_squares(_pack(squares[:3])[0].to(device), sides[:3], size=SIZE).cpu()
    assert torch.equal(one_side, ours[:3])
    # A batch whose every image was unreadable: nothing shipped, an empty batch of the right shape.
    assert resample_squares(torch.empty(0, dtype=torch.uint8, device=device), [], size=SIZE).shape == (0, 3, SIZE,
                                                                                                        SIZE)


def _folder(tmp_path, *, decode_scale: str = "auto"):
    """Noise JPEGs of the shapes above (and a PNG, which PIL decodes and resamples in the worker) in 2 classes,
    one file not an image, indexed as storage "files"."""
    for i, (w, h) in enumerate(SHAPES * 2):
        folder = tmp_path / "src" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:02d}.jpg").write_bytes(_jpeg(w, h, seed=i))
    Image.fromarray(np.full((18, 22, 3), 90, dtype=np.uint8)).save(tmp_path / "src" / "c0" / "png.png")
    (tmp_path / "src" / "c1" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    return prepare_image_folder(source=tmp_path / "src", root=tmp_path / f"prepared_{decode_scale}",
                                image_size=SIZE, storage="files", decode_scale=decode_scale)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_reader_that_resamples_on_the_device_reads_the_workers_batches(tmp_path, workers, monkeypatch):
    """The same rows kept (an unreadable file dropped and counted alike), the pixels to rounding; with a worker the
    squares travel packed in its shared memory, and the reader resamples each batch (counted)."""
    dataset = load_dataset(_folder(tmp_path), max_skip_fraction=0.5)
    plan = [np.arange(0, 7), np.arange(7, len(dataset))]
    expected = list(iter_batches(dataset, plan, workers=workers, max_skip_fraction=0.5))
    calls = []
    monkeypatch.setattr(loading, "resample_squares", lambda flat, sides, size: calls.append(list(sides)) or
                        resample_squares(flat, sides, size=size))
    got = list(iter_batches(dataset, plan, workers=workers, max_skip_fraction=0.5, resample_on=torch.device("cpu")))
    shipped = sorted(calls[0] + calls[1])  # each JPEG's square unresampled; the PNG (PIL's path) at 16 already
    assert len(calls) == 2 and shipped == sorted([20, 20, 20, 16, 12, 11] * 2 + [SIZE])
    assert len(got) == len(expected) == 2
    assert sum(len(kept) for kept, _ in got) == len(dataset) - 1  # the broken file, in both
    for (kept, images), (kept_workers, images_workers) in zip(got, expected):
        assert np.array_equal(kept, kept_workers)
        _assert_to_rounding(images, images_workers, max_level=2)


def test_a_folder_decoded_by_pil_reads_as_without_the_setting(tmp_path):
    """decode_scale "full": PIL resamples in the worker, so there is no square to ship and nothing for the device
    to do: the reader leaves the setting aside, and the batches are the very same."""
    dataset = load_dataset(_folder(tmp_path, decode_scale="full"), max_skip_fraction=0.5)
    assert BatchReader(dataset, workers=0, resample_on=torch.device("cpu")).resample_on is None
    plan = [np.arange(len(dataset))]
    (kept, images), = iter_batches(dataset, plan, workers=0, max_skip_fraction=0.5)
    (kept_on, images_on), = iter_batches(dataset, plan, workers=0, max_skip_fraction=0.5,
                                         resample_on=torch.device("cpu"))
    assert np.array_equal(kept, kept_on) and torch.equal(images, images_on)


def test_the_setting_resamples_on_cuda_only_and_falls_back_elsewhere(monkeypatch):
    """On a CUDA stage the reader resamples there; on a CPU stage the workers do (logged), so one config serves a
    GPU host and a laptop; off: the workers."""
    from contrastive.data import loading
    said = []  # the module's own logger, heard directly: whatever an earlier test did to logging's configuration
    monkeypatch.setattr(loading.log, "info", lambda message, *args: said.append(message % args))
    cuda = torch.device("cuda", 0)  # a device object: nothing runs on it
    assert resample_device(on_gpu=True, device=cuda) == cuda
    assert resample_device(on_gpu=False, device=cuda) is None
    assert said == []
    assert resample_device(on_gpu=True, device=torch.device("cpu")) is None
    assert len(said) == 1 and "train.resample_on_gpu is set but the stage runs on cpu" in said[0]


def test_the_setting_reaches_the_stage_and_its_export_and_stays_out_of_the_key():
    """``train.resample_on_gpu`` moves work, not results (the pixels to rounding, as ``train.tf32``): switching it
    reuses every finished step; the training spec and the export both read it."""
    from contrastive.modalities.registry import modality_for
    from pipeline_config.loader import load_config
    from pipeline_config.schema import digest_of

    data = {"digest": "data", "dir": "/data", "num_train": 1000}
    specs, keys, exports = [], [], []
    for value in ("false", "true"):
        config = load_config("trifeature_tiny", [f"train.resample_on_gpu={value}"])
        modality = modality_for(config.pipeline)
        keys.append(digest_of(modality.train_content(config, stage=1, seed=1, data=data, batches_key="b",
                                                     inherit_key=None)))
        specs.append(modality.train_spec(config, stage=1, seed=1, out_dir="/o", data=data, batches_path=None,
                                         init_model_path=None))
        exports.append(modality.export_kwargs(config, model_path="/m", data=data, out_dir="/e"))
    assert keys[0] == keys[1]
    assert [s.resample_on_gpu for s in specs] == [False, True]
    assert [e["resample_on_gpu"] for e in exports] == [False, True]
