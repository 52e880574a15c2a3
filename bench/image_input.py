"""Image input throughput per core: a folder of ImageNet-size JPEGs to batches ready on the host (issue 25).

The benchmark writes ``NUM_IMAGES`` JPEGs (500 x 375 and 375 x 500, quality 90, 4 class folders; smooth colour
fields with per-pixel noise, about 75 KB each, so a decoder has real entropy to read) and reads them for
``ROUNDS`` (5) epochs per side, interleaved (A B C, C B A, ...), after one warm-up epoch each, every side with the same
number of DataLoader worker processes (``contrastive.data.loading.default_workers()``: the cores of this process
less one), medians compared. Batch 64, shuffled, every image once per epoch.

- ours: ``prepare_image_folder(storage="files", image_size=224, decode_scale="auto")`` (the index: not timed) read
  by one ``contrastive.data.loading.BatchReader`` (persistent workers, pinned on CUDA): each worker decodes whole
  batches, JPEGs by libjpeg-turbo (these 500 x 375 photos at full scale: no fast reduced scale keeps 224 px), the
  centre square resampled to 224 by torch's uint8 kernel -> uint8 (64, 3, 224, 224). The random resized crop +
  flip is not done here: a stage draws it for the whole batch in one ``grid_sample`` on the device (a GPU's
  step, or a background thread of a CPU stage). A second row adds that crop on the host, in the reading process,
  so the work equals the baseline's; a third reads with ``decode_scale="full"`` (PIL) to show what the
  libjpeg-turbo decoder gives.
- baseline: ``torchvision.datasets.ImageFolder`` with ``transforms.v2.Compose([RandomResizedCrop(224,
  antialias=True), RandomHorizontalFlip(), PILToTensor()])`` (PIL decode, crop and resize on the PIL image: the
  faster of PIL-first and tensor-first on this machine, and uint8 out: no float conversion or normalisation billed
  to it) in ``DataLoader(batch_size=64, shuffle=True, num_workers=W, pin_memory=<CUDA>, persistent_workers=True,
  prefetch_factor=4)``.

CLIP shards (second comparison): ``CLIP_SAMPLES`` img2dataset-style samples (256 px JPEG + caption + json,
``write_tiny_shards``) in shards of 128, read to batches of 64 ready for a ViT-B-32 step: open_clip's own train
transform (``image_transform(224, is_train=True)``: random resized crop, float, normalised) and tokenizer
(``get_tokenizer("ViT-B-32")``) on both sides, the same number of decode workers W.

- ours: ``stream_batches(uint8=True, pool=...)`` (W decode worker processes kept across epochs, 2 tasks a worker
  in flight of a batch / W samples each, keyed augmentation, the images stacked as uint8) + ``ready_for_step`` (captions tokenised, pinned on CUDA), as a stage's reading
  thread runs them for a GPU, which normalises the batch in the step (bit-identical floats); an info row
  normalises on the host, as a CPU stage does.
- baseline: ``open_clip_train.data.get_wds_dataset(args, transform, is_train=True, tokenizer=...)`` with
  ``workers=W`` (DataLoader worker processes, persistent), its tar reader swapped as in ``bench/shards.py``
  (webdataset 1.x), iterated to the end of its epoch.

Per core: images per CPU-second, the CPU time of the reading process and of its worker processes together (the
workers persist, so ``/proc/<pid>/stat`` of each is read before and after every epoch), so the figure carries to a
host with more cores. Goals: ours >= 2x the baseline per core (image folder), >= 1.5x (CLIP shards).

The decode floor: libjpeg-turbo's decoding alone of the same files (``simplejpeg.decode_jpeg``, in this process,
median of 3 passes, CPU time) is measured in the same run and reported with the image-folder rows, with the ratio
it bounds: a reader that decodes each JPEG whole on a CPU cannot beat the baseline per core by more than
baseline CPU per image / decode alone.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import Result, fmt_count, log, median, module_main, threads_note

SIZE = 224
BATCH = 64
CLASSES = 4
SOURCE = (500, 375)
NAME = "Image input per core: JPEG folder -> batches of 224 px"
CLIP_NAME = "CLIP input per core: shards -> tokenised batches"
CLIP_SAMPLES = 768
CLIP_PER_SHARD = 128
ROUNDS = 5  # epochs a side after the warm-up; 3 left the image ratio 1.77x-2.10x apart on two runs an hour apart


def write_jpegs(root: Path, *, num_images: int, seed: int = 0) -> Path:
    """``root/class<c>/<i>.jpg``: ``num_images`` JPEGs of 500 x 375 (every other one portrait), quality 90."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(num_images):
        width, height = SOURCE if i % 2 == 0 else SOURCE[::-1]
        colours = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        field = np.asarray(Image.fromarray(colours).resize((width, height), Image.Resampling.BICUBIC), np.int16)
        pixels = np.clip(field + rng.normal(0, 10, field.shape), 0, 255).astype(np.uint8)
        folder = root / f"class{i % CLASSES}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"{i:05d}.jpg", quality=90)
    return root


def decode_floor_ms(folder: Path, *, passes: int = 3) -> float:
    """CPU milliseconds an image of libjpeg-turbo's decoding alone (RGB, whole image) of every JPEG under
    ``folder``, median of ``passes``: the part of any CPU reader's work that no design removes."""
    import simplejpeg

    encoded = [path.read_bytes() for path in sorted(folder.rglob("*.jpg"))]
    times = []
    for _ in range(passes):
        start = time.process_time()
        for data in encoded:
            simplejpeg.decode_jpeg(data, colorspace="RGB")
        times.append((time.process_time() - start) / len(encoded) * 1e3)
    return median(times)


def _worker_pids(loader) -> list[int]:
    iterator = getattr(loader, "_iterator", None)
    return [w.pid for w in getattr(iterator, "_workers", [])]


def _cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) used so far by the processes ``pids`` (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the line)
    return total / ticks


class Side:
    """One way of reading an epoch: ``epoch()`` -> images read; ``loader()`` the DataLoader (for its worker pids)."""

    def epoch(self) -> int:
        raise NotImplementedError

    def loader(self):
        raise NotImplementedError

    def worker_pids(self) -> list[int]:
        """The side's worker processes (their CPU is the side's too)."""
        return _worker_pids(self.loader()) if self.loader() is not None else []


class Ours(Side):
    def __init__(self, *, dataset_dir: Path, workers: int, crop_on_host: bool):
        import torch

        from contrastive.data.loading import BatchReader, load_dataset

        self.dataset = load_dataset(dataset_dir)
        self.reader = BatchReader(self.dataset, workers=workers)
        self.crop_on_host = crop_on_host
        self.epoch_index = 0
        self.torch = torch

    def epoch(self) -> int:
        from contrastive.modalities.image.adapter import augment_seed
        from contrastive.modalities.image.augment import random_resized_crop

        torch = self.torch
        self.epoch_index += 1
        order = np.random.default_rng(self.epoch_index).permutation(len(self.dataset))
        plan = [order[i:i + BATCH] for i in range(0, len(order), BATCH)]
        seen = 0
        for index, (rows, images) in enumerate(self.reader.read(plan)):
            if self.crop_on_host:  # one view, as a stage draws it: keyed by (seed, epoch, batch)
                generator = torch.Generator().manual_seed(augment_seed(seed=0, epoch=self.epoch_index, index=index))
                images = random_resized_crop(images=images.float().div_(255), scale=(0.08, 1.0),
                                             ratio=(3 / 4, 4 / 3), hflip=True, generator=generator)
            seen += images.shape[0]
        return seen

    def loader(self):
        return self.reader._workers._loader

    def close(self) -> None:
        self.reader.close()


class Baseline(Side):
    def __init__(self, *, folder: Path, workers: int):
        import torch
        from torch.utils.data import DataLoader
        from torchvision.datasets import ImageFolder
        from torchvision.transforms import v2

        transform = v2.Compose([v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip(),
                                v2.PILToTensor()])
        self._loader = DataLoader(ImageFolder(str(folder), transform=transform), batch_size=BATCH, shuffle=True,
                                  num_workers=workers, pin_memory=torch.cuda.is_available(),
                                  persistent_workers=workers > 0, prefetch_factor=4 if workers else None)

    def epoch(self) -> int:
        return sum(images.shape[0] for images, _ in self._loader)

    def loader(self):
        return self._loader

    def close(self) -> None:
        iterator = getattr(self._loader, "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()


class ClipOurs(Side):
    """As a stage reads: one decode pool kept across epochs, uint8 images, tokenised in the decode workers;
    ``normalize_on_host``: as a CPU stage (the reading thread normalises), else as a GPU stage (the step normalises on
    the device)."""

    def __init__(self, *, urls: list[str], transform, tokenizer, workers: int, normalize_on_host: bool,
                 batch: int = BATCH):
        import torch

        from contrastive.modalities.image_text.data import SampleDecodePool, SampleDecoder
        self.urls, self.transform, self.tokenizer, self.workers = urls, transform, tokenizer, workers
        self.normalize_on_host, self.batch = normalize_on_host, batch
        self.pin = torch.cuda.is_available()
        self.epoch_index = 0
        self.pool = SampleDecodePool(SampleDecoder(transform, seed=0, uint8=True,
                                                   tokenizer=tokenizer if workers else None), workers=workers)

    def epoch(self) -> int:
        from contrastive.modalities.image_text.data import SkipCounter, ready_for_step, stream_batches

        self.epoch_index += 1
        counter = SkipCounter(max_skip_fraction=0.01, where="bench")
        seen = 0
        for batch in stream_batches(urls=self.urls, batch_size=self.batch, transform=self.transform, counter=counter,
                                    seed=0, epoch=self.epoch_index, uint8=True, pool=self.pool):
            seen += len(ready_for_step(batch, tokenizer=self.tokenizer, pin_memory=self.pin,
                                       normalize=self.normalize_on_host))
        return seen

    def loader(self):
        return self.pool.pool._loader

    def worker_pids(self) -> list[int]:
        """The decode workers and the worker that reads the shards' tar headers."""
        return [w.pid for w in (*self.pool.pool.worker_processes(), *self.pool.indexer.worker_processes())]

    def close(self) -> None:
        self.pool.close()


class ClipBaseline(Side):
    """open_clip_train's ``get_wds_dataset`` as its training reads it (persistent DataLoader workers; pinned memory
    where there is CUDA, which open_clip's loader leaves off and a user who wants asynchronous copies turns on)."""

    def __init__(self, *, urls: list[str], transform, tokenizer, workers: int, batch: int = BATCH,
                 per_shard: int = CLIP_PER_SHARD):
        import types

        import open_clip_train.data as open_clip_data
        import torch
        import webdataset as wds

        # As bench/shards.py: open_clip's tar reader needs webdataset <= 0.2.86; its source names this alternative.
        open_clip_data.tarfile_to_samples_nothrow = wds.tarfile_to_samples(handler=open_clip_data.log_and_continue)
        args = types.SimpleNamespace(
            train_data="::".join(urls), train_num_samples=len(urls) * per_shard, dataset_resampled=False,
            train_data_upsampling_factors=None, seed=0, batch_size=batch, workers=workers, world_size=1)
        self.info = open_clip_data.get_wds_dataset(args, transform, is_train=True, epoch=0, tokenizer=tokenizer)
        if torch.cuda.is_available():  # the same loader with pinned batches
            self.info.dataloader = wds.WebLoader(self.info.dataloader.pipeline[0].dataset, batch_size=None,
                                                 shuffle=False, num_workers=workers, pin_memory=True,
                                                 persistent_workers=workers > 0)
        self.epoch_index = 0

    def epoch(self) -> int:
        self.epoch_index += 1
        self.info.set_epoch(self.epoch_index)
        return sum(len(images) for images, _ in self.info.dataloader)

    def loader(self):
        return self.info.dataloader.pipeline[0]  # wds.WebLoader is a pipeline around one DataLoader

    def close(self) -> None:
        iterator = getattr(self.loader(), "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()


def clip_sides(*, work: Path, workers: int) -> dict[str, Side]:
    """The two CLIP readers on ``CLIP_SAMPLES`` samples of 256 px written under ``work``."""
    from open_clip import get_tokenizer, image_transform

    from contrastive.modalities.image_text.data import write_tiny_shards

    shards = write_tiny_shards(directory=work / "shards", num_samples=CLIP_SAMPLES, samples_per_shard=CLIP_PER_SHARD,
                               image_size=256, corrupt=False)
    transform, tokenizer = image_transform(224, is_train=True), get_tokenizer("ViT-B-32")
    return {"clip ours": ClipOurs(urls=shards["urls"], transform=transform, tokenizer=tokenizer, workers=workers,
                                  normalize_on_host=False),
            "clip ours, normalised on the host": ClipOurs(urls=shards["urls"], transform=transform,
                                                          tokenizer=tokenizer, workers=workers, normalize_on_host=True),
            "clip baseline": ClipBaseline(urls=shards["urls"], transform=transform, tokenizer=tokenizer,
                                          workers=workers)}


def _timed_epoch(side: Side) -> dict:
    pids = side.worker_pids()
    cpu0, workers0, start = time.process_time(), _cpu_seconds(pids), time.perf_counter()
    images = side.epoch()
    seconds = time.perf_counter() - start
    pids = pids or side.worker_pids()
    cpu = time.process_time() - cpu0 + _cpu_seconds(pids) - workers0
    return {"images": images, "seconds": seconds, "cpu_seconds": cpu}


def run(*, quick: bool) -> list[Result]:
    import torch

    from contrastive.modalities.image.datasets.image_folder import prepare_image_folder
    from contrastive.data.loading import default_workers

    torch.set_num_threads(1)  # the reading process: its own thread decodes nothing; one thread crops (host row)
    num_images = 384 if quick else 1_024
    rounds = ROUNDS
    workers = default_workers()
    note = threads_note()
    work = Path(tempfile.mkdtemp(prefix="bench-image-input-"))
    try:
        begin = time.perf_counter()
        folder = write_jpegs(work / "images", num_images=num_images)
        dirs = {scale: prepare_image_folder(source=folder, root=work / "data", image_size=SIZE, storage="files",
                                            decode_scale=scale) for scale in ("auto", "full")}
        log(f"image input: {num_images} JPEGs written and indexed in {time.perf_counter() - begin:.1f} s; "
            f"{workers} worker(s) a side")
        sides = {"ours": Ours(dataset_dir=dirs["auto"], workers=workers, crop_on_host=False),
                 "ours + crop on host": Ours(dataset_dir=dirs["auto"], workers=workers, crop_on_host=True),
                 "ours, decode_scale=full": Ours(dataset_dir=dirs["full"], workers=workers, crop_on_host=False),
                 "baseline": Baseline(folder=folder, workers=workers)}
        sides.update(clip_sides(work=work, workers=workers))
        startup = {}
        for name, side in sides.items():  # warm-up: workers start (persistent), files enter the page cache
            startup[name] = _timed_epoch(side)["seconds"]
        runs: dict[str, list[dict]] = {name: [] for name in sides}
        names = list(sides)
        for round_number in range(rounds):
            for name in names if round_number % 2 == 0 else names[::-1]:
                runs[name].append(_timed_epoch(sides[name]))
        for side in sides.values():
            side.close()
        floor_ms = decode_floor_ms(folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [*results(runs=runs, startup=startup, workers=workers, num_images=num_images, note=note,
                     decode_floor=floor_ms),
            *clip_result(runs=runs, startup=startup, workers=workers, note=note)]


def _rates(runs: list[dict]) -> tuple[float, float, float]:
    """(median seconds an epoch, median images/s, median images per CPU-second)."""
    return (median([r["seconds"] for r in runs]), median([r["images"] / r["seconds"] for r in runs]),
            median([r["images"] / r["cpu_seconds"] for r in runs]))


def results(*, runs: dict[str, list[dict]], startup: dict[str, float], workers: int, num_images: int,
            note: str, decode_floor: float) -> list[Result]:
    """The image-folder rows; ``decode_floor``: CPU ms an image of libjpeg-turbo's decoding alone (this run)."""
    base_s, base_rate, base_per_core = _rates(runs["baseline"])
    base_ms = 1e3 / base_per_core
    floor_note = (f"decode floor: libjpeg-turbo's decoding alone takes {decode_floor:.2f} ms of CPU an image "
                  f"(this run), the baseline {base_ms:.2f} ms an image in all: a CPU reader that decodes every "
                  f"JPEG whole is at most {base_ms / decode_floor:.2f}x the baseline per core")
    workload = (f"{fmt_count(num_images)} JPEGs 500x375 / 375x500 (q90, ~75 KB) -> uint8 batches of {BATCH} x 3 x "
                f"{SIZE} x {SIZE} on the host, {workers} DataLoader worker(s) a side, 1 torch thread in the reading "
                f"process; medians of {len(runs['baseline'])} interleaved epochs after a warm-up epoch")
    baseline = ("torchvision ImageFolder + v2 RandomResizedCrop(224, antialias) + RandomHorizontalFlip + "
                f"PILToTensor, DataLoader(batch {BATCH}, shuffle, num_workers={workers}, pin_memory on CUDA, "
                "persistent_workers, prefetch_factor 4)")
    out = []
    rows = [("ours", f"{NAME}", ">= 2x images per CPU-second"),
            ("ours + crop on host", f"{NAME}, crop + flip on the host too (info)", "-"),
            ("ours, decode_scale=full", f"{NAME}, decode_scale=full (info)", "-")]
    for key, name, goal in rows:
        seconds, rate, per_core = _rates(runs[key])
        ratio = per_core / base_per_core
        notes = [f"ours {rate:.0f} images/s, {per_core:.0f} images per CPU-second; baseline {base_rate:.0f} "
                 f"images/s, {base_per_core:.0f} per CPU-second (reading process + its workers)",
                 f"wall-clock ratio {rate / base_rate:.2f}x (both sides have {workers} worker(s) on a shared "
                 "machine: per CPU-second is the figure that carries to a host with more cores)",
                 f"first epoch (worker start-up, cold page cache): ours {startup[key]:.1f} s, baseline "
                 f"{startup['baseline']:.1f} s", note]
        if key != "ours, decode_scale=full":
            notes.insert(0, f"ours {1e3 / per_core:.2f} ms of CPU an image; " + floor_note)
        if key == "ours":
            notes.insert(0, "ours stops at the uint8 224 px square; the crop + flip is one batched grid_sample in "
                            "the training step (on the GPU), see the next row for it on the host")
        out.append(Result(name=name, workload=workload, baseline=baseline, baseline_s=base_s, ours_s=seconds,
                          ratio=ratio, ratio_note="images per CPU-second", goal=goal,
                          passed=(ratio >= 2.0) if goal != "-" else None, notes=notes,
                          details={"runs": runs[key], "baseline_runs": runs["baseline"], "workers": workers,
                                   "decode_floor_ms": decode_floor}))
    return out


def clip_result(*, runs: dict[str, list[dict]], startup: dict[str, float], workers: int, note: str) -> list[Result]:
    base_s, base_rate, base_per_core = _rates(runs["clip baseline"])
    out = []
    for key, name, goal in (("clip ours", CLIP_NAME, ">= 1.5x samples per CPU-second"),
                            ("clip ours, normalised on the host", f"{CLIP_NAME}, normalised on the host (info)", "-")):
        seconds, rate, per_core = _rates(runs[key])
        ratio = per_core / base_per_core
        where = ("uint8 batch, normalised by the GPU in the step (as a GPU stage reads)" if key == "clip ours" else
                 "float batch normalised by the reading thread (as a CPU stage reads)")
        out.append(Result(
            name=name,
            workload=(f"{fmt_count(CLIP_SAMPLES)} samples (256 px JPEG + caption) in {CLIP_SAMPLES // CLIP_PER_SHARD} "
                      f"shards -> batches of {BATCH}: open_clip's ViT-B-32 train transform (224 px) and tokenizer on "
                      f"both sides, {workers} decode worker(s) a side; medians of {len(runs[key])} interleaved epochs "
                      "after a warm-up epoch"),
            baseline=(f"open_clip_train.data.get_wds_dataset(workers={workers}, batch {BATCH}, tokenizer), its "
                      "DataLoader worker processes persistent, float normalised batches; tar reader swapped for "
                      "webdataset 1.x as in bench/shards.py"),
            baseline_s=base_s, ours_s=seconds, ratio=ratio, ratio_note="samples per CPU-second", goal=goal,
            passed=(ratio >= 1.5) if goal != "-" else None,
            notes=[f"ours: {where}", f"ours {rate:.0f} samples/s, {per_core:.0f} per CPU-second (decode worker "
                   f"processes, tokenised there); open_clip {base_rate:.0f} samples/s, "
                   f"{base_per_core:.0f} per CPU-second (process + its workers)",
                   f"wall-clock ratio {rate / base_rate:.2f}x",
                   f"first epoch: ours {startup[key]:.1f} s, open_clip {startup['clip baseline']:.1f} s "
                   "(its worker start-up)", note],
            details={"runs": runs[key], "baseline_runs": runs["clip baseline"], "workers": workers}))
    return out


if __name__ == "__main__":
    module_main(run)
