"""Training throughput of the engine (``contrastive.engine.loop.train``) on CPU, against the loops peers write.

1. Unimodal SimCLR from an image folder. A temporary folder of JPEGs (64 x 64, 4 class subfolders, random shapes
   on noise, drawn with PIL) is trained on for one epoch, batch 64, the default preset's encoder (``small_cnn``
   widths 32/64/128/256, head 256-256-128, SimCLR temperature 0.2), crop-only augmentation (scale 0.25-1, ratio
   3/4-4/3), fp32, one DataLoader worker, the same number of torch threads on both sides: once at 1 thread and
   once at torch's default (every core), one row each.

   - ours: ``contrastive.modalities.image.steps.train_stage`` with an ``ImageStageSpec`` on ``prepare_image_folder(...,
     image_size=32, storage="files")``: whole batches decoded in a DataLoader worker (``iter_batches``), uint8 to
     the training process, two views cropped there for the whole batch (``TwoViewAugment``: one ``grid_sample``),
     channels_last (the training config's default), Adam, cosine schedule, the end-of-epoch checkpoint.
   - baseline: what the public SimCLR loops do: ``torchvision.datasets.ImageFolder`` with per-sample
     ``transforms.v2`` (Resize 32, then RandomResizedCrop(32, scale=(0.25, 1)) + ToImage + ToDtype twice for two
     views), ``DataLoader(batch_size=64, num_workers=1, shuffle=True)``, the SAME model from
     ``contrastive.methods.build_method`` and its ``training_loss`` (NT-Xent) in channels_last as ours (the engine's
     model-side setting, so the ratio is the input path's), Adam, the same number of steps.

   Goal (issue 25; both sides in channels_last, so the ratio is the input path's): ours >= 1.0x the baseline's
   images/s at 1 torch thread and > 1.0x at every core. Only the epoch is timed (ours: the engine's own clock around its
   epoch loop, as ``train_summary.json`` reports it; baseline: from creating the DataLoader to the last optimizer
   step); preparing the folder and building the model are not. Each side first runs a 2-step warm-up of its own
   (so neither pays one-off costs: our workers' forkserver, the allocator), then 3 epochs interleaved (A B, B A, A B),
   medians compared. Per-epoch costs stay in: every epoch starts a new DataLoader worker on both sides.
   An info row reports the in-memory fast path (``storage="memory"``, ``images.npy``, no workers).

2. Two-rank gloo DDP on CPU (info): the same stage spawned as 2 processes (``torch.multiprocessing.spawn``,
   ``DistInfo(rank, world_size=2)``, 1 torch thread and 1 decode worker each, global batch 64 = 32 per rank)
   against 1 process with 1 thread and the same global batch. Ideal on this 2-core machine: 2x. One epoch each
   after a warm-up (rank 0's engine clock).

3. GPU rows (ResNet-50 SimCLR bf16, ViT-B-32 CLIP, faiss GPU k-means, the tiny pipeline on CUDA): measured only
   where a GPU is visible; here they say so.

4. CLIP fine-tuning on the tiny model (``mclpipe-tiny-vit``, 2-layer ViT of width 64 on 32 px, text tower locked)
   against ``open_clip_train.train.train_one_epoch`` (open_clip's own training step) on the same tiny shards,
   batch and steps, 3 interleaved runs each after a warm-up. See :func:`clip_vs_open_clip`.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import Result, fmt_count, log, median, module_main, threads_note
from contrastive.engine.ports import free_port

BATCH = 64
IMAGE_SIZE = 32  # training resolution
SOURCE_SIZE = 64  # side of the JPEGs written
CLASSES = 4
THREADS = 1  # torch threads of the training process, both sides, in the rows not run at every setting
WARMUP_STEPS = 2
ROUNDS = 3  # interleaved runs of each side (A B, B A, A B), medians compared
DDP_WORLD = 2
AUGMENT = dict(crop_scale=(0.25, 1.0), crop_ratio=(0.75, 4.0 / 3.0), hflip=False, color_jitter=0.0)
NOT_LENT = "not measured: no GPU was lent to this task"
LOAD_AT_START = [""]  # threads_note() when run() starts


# ---------------------------------------------------------------------------------------------------- data
def write_image_folder(root: Path, *, num_images: int, size: int = SOURCE_SIZE, classes: int = CLASSES,
                       seed: int = 0) -> Path:
    """``root/class<c>/<i>.jpg``: noise plus three random rectangles (even classes) or ellipses (odd ones)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
    for i in range(num_images):
        c = i % classes
        image = Image.fromarray((rng.integers(0, 128, (size, size, 3), dtype=np.uint8) + 64).astype(np.uint8))
        draw = ImageDraw.Draw(image)
        for _ in range(3):
            x0, y0 = (int(v) for v in rng.integers(0, size - size // 4, 2))
            w, h = (int(v) for v in rng.integers(size // 8, size // 2, 2))
            box = [x0, y0, min(size - 1, x0 + w), min(size - 1, y0 + h)]
            fill = tuple(int(v) for v in rng.integers(0, 256, 3))
            (draw.ellipse if c % 2 else draw.rectangle)(box, fill=fill)
        image.save(root / f"class{c}" / f"{i:06d}.jpg", quality=90)
    return root


# ---------------------------------------------------------------------------------------------------- ours
def stage_spec(*, dataset_dir: Path, stage_dir: Path, threads: int, workers: int,
               max_steps: int | None = None, model: dict | None = None):
    """Our stage of the unimodal rows: ``model`` (the config's model section; default the preset's CNN)."""
    from bench import fixtures
    from contrastive.engine.task import LoopSpec, OptimSpec
    from contrastive.modalities.image.steps import ImageStageSpec

    return ImageStageSpec(
        dataset_dir=str(dataset_dir), stage_dir=str(stage_dir), pseudo_labels_path=None,
        model=model or fixtures.model_kwargs(), method={"name": "simclr", "temperature": 0.2}, augment=dict(AUGMENT),
        batch_size=BATCH, remainder_policy="partial", workers=workers, seed=0, device="cpu", threads=threads,
        optim=OptimSpec(name="adam", lr=1e-3, weight_decay=1e-6, schedule="cosine"),
        loop=LoopSpec(epochs=1, checkpoint_every_steps=500, log_every_steps=10, precision="fp32",
                      channels_last=True, max_steps_per_epoch=max_steps))


class _Arrivals:
    """Engine callback: when each batch reached the loop (``on_batch`` runs on every micro-batch)."""

    def __init__(self):
        self.times: list[float] = []
        self.loop_started: float | None = None

    def on_train_start(self, *, total_steps: int, step: int) -> None:
        self.loop_started = time.perf_counter()  # the loop's clock starts here: its stage is built, its model made

    def on_batch(self, *, step: int, batch) -> None:
        self.times.append(time.perf_counter())

    def on_step(self, *, step: int, epoch: int, metrics: dict) -> None:
        pass

    def on_epoch_end(self, *, epoch: int, metrics: dict) -> None:
        pass

    def on_checkpoint(self, *, path, step: int) -> None:
        pass


def _steady(arrivals: list[float]) -> float | None:
    """Images/s between the first and the last batch's arrival (per-epoch start-up costs left out)."""
    if len(arrivals) < 2:
        return None
    return (len(arrivals) - 1) * BATCH / (arrivals[-1] - arrivals[0])


def warm_up_ours(*, dataset_dir: Path, work: Path, name: str, threads: int, workers: int,
                 model: dict | None = None) -> None:
    """A WARMUP_STEPS-step stage: first-touch costs (allocator, our workers' forkserver) are paid here."""
    from contrastive.modalities.image import steps as stages

    stages.train_stage(stage_spec(dataset_dir=dataset_dir, stage_dir=work / f"{name}-warmup", threads=threads,
                                  workers=workers, max_steps=WARMUP_STEPS, model=model))


def run_ours(*, dataset_dir: Path, work: Path, name: str, threads: int, workers: int,
             model: dict | None = None) -> dict:
    """One full epoch in a fresh stage directory (one holding a checkpoint would resume). Returns the stage's
    summary plus the wall seconds of the whole call, when the first batch reached the loop and the rate after it."""
    from contrastive.modalities.image import steps as stages

    arrivals = _Arrivals()
    started = time.perf_counter()
    summary = stages.train_stage(stage_spec(dataset_dir=dataset_dir, stage_dir=work / name, threads=threads,
                                            workers=workers, model=model), callbacks=[arrivals])
    call = time.perf_counter() - started
    return {**summary, "call_seconds": call, "steady_samples_per_second": _steady(arrivals.times),
            # From the call (dataset opened, model built: a few tens of ms) to the first batch in the loop.
            "first_batch_s": arrivals.times[0] - started if arrivals.times else None}


# ---------------------------------------------------------------------------------------------------- baseline
class TwoViews:
    """The per-sample two-view transform of the public SimCLR loops (torchvision transforms.v2 on PIL images)."""

    def __init__(self, size: int):
        import torch
        from torchvision.transforms import v2

        self.resize = v2.Resize(size)
        self.view = v2.Compose([
            v2.RandomResizedCrop(size, scale=AUGMENT["crop_scale"], ratio=AUGMENT["crop_ratio"]),
            v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])

    def __call__(self, image):
        image = self.resize(image)
        return self.view(image), self.view(image)


class Baseline:
    """ImageFolder + per-sample transforms.v2 + DataLoader(64, 1 worker, shuffle) + the same method and Adam: the
    SimCLR loop of the public reference code. :meth:`epoch` runs ``limit`` steps with a fresh DataLoader (as every
    epoch of such a loop does) and times them."""

    def __init__(self, *, folder: Path, threads: int, model: dict | None = None, workers: int = 1):
        import torch
        from torchvision.datasets import ImageFolder

        from bench import fixtures
        from contrastive.methods import build_method

        torch.set_num_threads(threads)
        torch.manual_seed(0)
        self.dataset = ImageFolder(str(folder), transform=TwoViews(IMAGE_SIZE))
        self.workers = workers
        self.method = build_method(model_kwargs=model or fixtures.model_kwargs(),
                                   method_kwargs={"name": "simclr", "temperature": 0.2})
        self.method.train()
        # The engine's model-side setting, given to the baseline too (one line in any peer loop), so the ratio
        # compares the input paths alone: channels_last weights here, channels_last views in the step.
        self.method.to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.Adam(self.method.parameters(), lr=1e-3, weight_decay=1e-6)

    def epoch(self, limit: int) -> dict:
        import torch
        from torch.utils.data import DataLoader

        self.method.on_train_start(total_steps=limit)
        started, images, loss, arrivals = time.perf_counter(), 0, float("nan"), []
        # pin_memory as a competent user sets it (it only acts with a GPU: a CPU run would warn and ignore it)
        loader = DataLoader(self.dataset, batch_size=BATCH, num_workers=self.workers, shuffle=True,
                            pin_memory=torch.cuda.is_available())
        for step, ((view1, view2), _) in enumerate(loader):
            if step >= limit:
                break
            arrivals.append(time.perf_counter())
            view1, view2 = (v.contiguous(memory_format=torch.channels_last) for v in (view1, view2))
            loss_t, _ = self.method.training_loss(view1, view2, step=step)
            self.optimizer.zero_grad(set_to_none=True)
            loss_t.backward()
            self.optimizer.step()
            loss = loss_t.item()
            images += len(view1)
        seconds = time.perf_counter() - started
        del loader  # stops the worker
        return {"seconds": seconds, "images": images, "steps": len(arrivals), "final_loss": loss,
                "samples_per_second": images / seconds, "steady_samples_per_second": _steady(arrivals),
                "first_batch_s": arrivals[0] - started if arrivals else None}


# ---------------------------------------------------------------------------------------------------- 1. unimodal
BASELINE_TEXT = ("torchvision ImageFolder + per-sample transforms.v2 (Resize, RandomResizedCrop x2, ToImage, "
                 "ToDtype) + DataLoader(64, 1 worker, shuffle) + the same model/loss, channels_last, Adam")


def thread_settings() -> list[int]:
    """Torch threads to compare at: 1 (one core for the model, the other for data on both sides) and torch's
    default, every core (what ``train.threads: 0`` and a peer loop that does not set it get)."""
    return sorted({1, os.cpu_count() or 1})


def files_comparison(*, folder: Path, files_dir: Path, stage_dirs: Path, threads: int, steps: int,
                     model: dict | None = None, workers: int = 1, rounds: int = ROUNDS) -> dict:
    """``rounds`` interleaved epochs of ours (files, ``workers`` decode workers) and the baseline (as many DataLoader
    workers), both at ``threads`` torch threads and with ``model`` (default the preset's CNN), each after a warm-up
    of its own. Returns {"ours": [records], "baseline": [records]}."""
    baseline = Baseline(folder=folder, threads=threads, model=model, workers=workers)
    warm_up_ours(dataset_dir=files_dir, work=stage_dirs, name=f"files-t{threads}", threads=threads, workers=workers,
                 model=model)
    baseline.epoch(WARMUP_STEPS)
    # Rounds A B, B A: the order alternates so drifts of the shared machine's load fall on both sides.
    candidates = {"ours": lambda n: run_ours(dataset_dir=files_dir, work=stage_dirs, name=f"files-t{threads}-{n}",
                                             threads=threads, workers=workers, model=model),
                  "baseline": lambda n: baseline.epoch(steps)}
    runs: dict[str, list[dict]] = {"ours": [], "baseline": []}
    for round_number in range(rounds):
        for name in (list(candidates) if round_number % 2 == 0 else list(candidates)[::-1]):
            record = candidates[name](round_number)
            runs[name].append(record)
            log(f"engine: {threads} thread(s): {name} {record['steps']} steps in {record['seconds']:.2f} s = "
                f"{record['samples_per_second']:.0f} images/s (first batch after {record['first_batch_s']:.2f} s)")
    assert all(r["steps"] == steps for rs in runs.values() for r in rs), "both sides must run the same steps"
    return runs


def files_result(*, runs: dict, threads: int, num_images: int, steps: int) -> Result:
    def med(name: str, key: str) -> float:
        return median([r[key] for r in runs[name]])

    ours_rate, base_rate = med("ours", "samples_per_second"), med("baseline", "samples_per_second")
    ours_steady, base_steady = med("ours", "steady_samples_per_second"), med("baseline", "steady_samples_per_second")
    ratio = ours_rate / base_rate
    per_run = lambda name: ", ".join(f"{r['samples_per_second']:.0f}" for r in runs[name])  # noqa: E731
    default = " (torch's default: every core)" if threads == os.cpu_count() and threads > 1 else ""
    return Result(
        name=f"Engine: unimodal training from an image folder (files), {threads} torch thread(s){default}",
        workload=_workload(num_images=num_images, steps=steps, threads=threads, reader="1 DataLoader worker"),
        baseline=BASELINE_TEXT, baseline_s=steps * BATCH / base_rate, ours_s=steps * BATCH / ours_rate, ratio=ratio,
        ratio_note=f"images/s ratio, median of {ROUNDS} runs each",
        # Issue 25: both sides in channels_last, so this is the input path's ratio: >= 1.0x with one torch thread
        # (nothing of the input on the training thread's core), ahead (> 1.0x) at every core.
        goal=">= 1.0x (images/s)" if threads == 1 else "> 1.0x (images/s)",
        passed=ratio >= 1.0 if threads == 1 else ratio > 1.0,
        notes=[f"images/s over the epoch (median of {ROUNDS} interleaved runs): ours {ours_rate:.0f} "
               f"(runs {per_run('ours')}), baseline {base_rate:.0f} (runs {per_run('baseline')})",
               f"first batch after: ours {med('ours', 'first_batch_s'):.2f} s (its decode worker comes from a "
               "forkserver that preloads torch), baseline "
               f"{med('baseline', 'first_batch_s'):.2f} s (fork); after the first batch: ours {ours_steady:.0f} "
               f"images/s, baseline {base_steady:.0f} images/s ({ours_steady / base_steady:.2f}x)",
               "ours: prepare_image_folder(storage='files') + stages.train_stage (batches decoded whole in the "
               "worker, crops of the whole batch made on a background thread ahead of the step, channels_last), "
               "timed by the engine's clock around its epoch (the end-of-epoch checkpoint included); the whole "
               f"train_stage call (dataset open, model build, epoch, model save) took {med('ours', 'call_seconds'):.2f}"
               f" s against {med('ours', 'seconds'):.2f} s on the engine's clock",
               f"threads: {threads} torch thread(s) on both sides; both sides' decode worker shares the cores with "
               "the training process",
               f"final loss: ours {runs['ours'][-1]['final_loss']:.3f}, baseline "
               f"{runs['baseline'][-1]['final_loss']:.3f} (a sanity check that both train; the baseline's model "
               "continues from its earlier runs)",
               f"each side warmed up with a {WARMUP_STEPS}-step run first; preparing the folder is not timed; "
               f"machine: {LOAD_AT_START[0]} of this module"],
        details={"runs": runs})


def _workload(*, num_images: int, steps: int, threads: int, reader: str) -> str:
    return (f"{fmt_count(num_images)} JPEGs {SOURCE_SIZE}x{SOURCE_SIZE} -> {IMAGE_SIZE} px, SimCLR small_cnn "
            f"32/64/128/256, batch {BATCH}, crop-only, 1 epoch ({steps} steps), fp32, CPU, {threads} torch "
            f"thread(s), {reader}")


def unimodal(*, quick: bool, work: Path) -> list[Result]:
    from contrastive.modalities.image.datasets.image_folder import prepare_image_folder

    num_images = 1_024 if quick else 2_048
    started = time.perf_counter()
    folder = write_image_folder(work / "images", num_images=num_images)
    files_dir = prepare_image_folder(source=folder, root=work / "data", image_size=IMAGE_SIZE, storage="files",
                                     test_fraction=0.0)
    memory_dir = prepare_image_folder(source=folder, root=work / "data", image_size=IMAGE_SIZE, storage="memory",
                                      test_fraction=0.0)
    log(f"engine: {num_images} JPEGs written, indexed and decoded once (memory) in "
        f"{time.perf_counter() - started:.1f} s")
    stage_dirs = work / "stages"
    steps = num_images // BATCH  # every image is in the train split (test_fraction 0)

    comparisons = {threads: files_comparison(folder=folder, files_dir=files_dir, stage_dirs=stage_dirs,
                                             threads=threads, steps=steps) for threads in thread_settings()}
    results = [files_result(runs=runs, threads=threads, num_images=num_images, steps=steps)
               for threads, runs in comparisons.items()]
    warm_up_ours(dataset_dir=memory_dir, work=stage_dirs, name="memory", threads=THREADS, workers=0)
    memory = run_ours(dataset_dir=memory_dir, work=stage_dirs, name="memory", threads=THREADS, workers=0)
    log(f"engine: ours (memory) {memory['steps']} steps in {memory['seconds']:.2f} s = "
        f"{memory['samples_per_second']:.0f} images/s")
    base_rate = median([r["samples_per_second"] for r in comparisons[THREADS]["baseline"]])
    results.append(Result(
        name="Engine: unimodal training, in-memory fast path",
        workload=_workload(num_images=num_images, steps=steps, threads=THREADS, reader="no worker (images.npy "
                           "slices)"),
        baseline=BASELINE_TEXT, baseline_s=steps * BATCH / base_rate, ours_s=memory["seconds"],
        ratio=memory["samples_per_second"] / base_rate, ratio_note="images/s ratio", goal="context", passed=None,
        notes=[f"images/s: ours (storage='memory') {memory['samples_per_second']:.0f} (one run after a warm-up), "
               f"baseline {base_rate:.0f} (the median of the {THREADS}-thread row); the folder decoded once into "
               "images.npy by prepare_image_folder (not timed)"],
        details={"ours": memory}))
    results.append(ddp_scaling(dataset_dir=files_dir, work=work / "ddp", num_images=num_images))
    return results


# ---------------------------------------------------------------------------------------------------- 2. DDP
def _ddp_rank(rank: int, world: int, port: int, dataset_dir: str, work: str) -> None:
    """One rank of the 2-process run (spawned: module-level so the child can import it)."""
    import torch
    import torch.distributed as dist

    from contrastive.modalities.image import steps as stages
    from contrastive.engine.distributed import DistInfo

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        info = DistInfo(rank=rank, world_size=world)
        stages.train_stage(stage_spec(dataset_dir=Path(dataset_dir), stage_dir=Path(work) / "ddp-warmup", threads=1,
                                      workers=1, max_steps=WARMUP_STEPS), info=info)
        arrivals = _Arrivals()
        stages.train_stage(stage_spec(dataset_dir=Path(dataset_dir), stage_dir=Path(work) / "ddp", threads=1,
                                      workers=1), info=info, callbacks=[arrivals])
        if rank == 0:
            (Path(work) / "ddp-arrivals.json").write_text(json.dumps(arrivals.times))
    finally:
        dist.destroy_process_group()


def _num_params() -> int:
    from bench import fixtures
    from contrastive.methods import build_method

    method = build_method(model_kwargs=fixtures.model_kwargs(), method_kwargs={"name": "simclr", "temperature": 0.2})
    return sum(p.numel() for p in method.parameters() if p.requires_grad)


def ddp_scaling(*, dataset_dir: Path, work: Path, num_images: int) -> Result:
    import torch.multiprocessing as mp

    load = os.getloadavg()[0]
    single = run_ours(dataset_dir=dataset_dir, work=work, name="single", threads=1, workers=1)
    log(f"engine: 1 process {single['samples_per_second']:.0f} images/s")
    started = time.perf_counter()
    mp.spawn(_ddp_rank, args=(DDP_WORLD, free_port(), str(dataset_dir), str(work)), nprocs=DDP_WORLD, join=True)
    spawn_seconds = time.perf_counter() - started
    double = json.loads((work / "ddp" / "train_summary.json").read_text())
    double_steady = _steady(json.loads((work / "ddp-arrivals.json").read_text()))
    single_steady = single["steady_samples_per_second"]
    log(f"engine: {DDP_WORLD} ranks {double['samples_per_second']:.0f} images/s")
    ratio = double["samples_per_second"] / single["samples_per_second"]
    return Result(
        name=f"Engine: {DDP_WORLD}-rank gloo DDP vs 1 process (CPU)",
        workload=(f"the image-folder stage above ({fmt_count(num_images)} JPEGs, files, 1 epoch = {single['steps']} "
                  f"steps), global batch {BATCH} ({BATCH // DDP_WORLD} per rank), 1 torch thread and 1 decode "
                  "worker per process"),
        baseline="the same stage in 1 process (1 thread, 1 worker, batch 64)", baseline_s=single["seconds"],
        ours_s=double["seconds"], ratio=ratio, ratio_note="images/s ratio", goal="context (ideal 2x on 2 cores)",
        passed=None,
        notes=[f"images/s: {DDP_WORLD} ranks {double['samples_per_second']:.0f}, 1 process "
               f"{single['samples_per_second']:.0f}; steps {double['steps']} vs {single['steps']}; after the first "
               f"batch (per-epoch worker start left out): {DDP_WORLD} ranks {double_steady:.0f}, 1 process "
               f"{single_steady:.0f} ({double_steady / single_steady:.2f}x)",
               f"machine: {LOAD_AT_START[0]} of this module, 1-min load average {load:.1f} when this row started",
               f"4 busy processes (2 ranks + 2 decode workers) share 2 cores with the machine's other jobs; the "
               f"ranks' gradients ({fmt_count(_num_params())} floats) are all-reduced over gloo every step, and "
               "GlobalBatchNorm all-reduces the batch statistics of every norm layer (forward and backward); "
               f"spawning the 2 processes, their warm-up and the timed epoch took {spawn_seconds:.1f} s in all (not "
               "in the ratio)",
               "where a rank's time goes (side run, torch.profiler over 12 steps, storage 'memory'): about 21 ms a "
               "step in aten::mul alone plus add/neg/sum/sub, the unfused elementwise passes of GlobalBatchNorm "
               "(contrastive.engine.distributed), where the 1-process run spends 18 ms a step in fused native batch "
               "norm at twice the batch; about 29 ms a step in gloo all-reduce calls, waiting for the other rank "
               "included (one all-reduce of 1 float costs 0.2 ms here, of the 488k gradients 1.25 ms)",
               "each side: a 2-step warm-up stage, then one timed epoch (engine clock of rank 0)"],
        details={"single": single, "ddp": double})


# ---------------------------------------------------------------------------------------------------- 3. GPU rows
def gpu_rows() -> list[Result]:
    """Rows that need a GPU. Without one (this machine, and every task not lent a device) they say so."""
    import torch

    rows = [
        ("Engine: ResNet-50 SimCLR bf16 on GPU (images/s, MFU)",
         "ResNet-50 SimCLR, bf16 autocast, channels_last, batch 256, 224 px, images/s and model FLOPs utilisation"),
        ("Engine: ViT-B-32 CLIP fine-tuning vs open_clip_train (GPU)",
         "ViT-B-32 CLIP fine-tuning, bf16, same shards, batch and steps as open_clip_train"),
        ("faiss GPU k-means 1M x 256, K=20000",
         "1M x 256 float32, K=20000, niter 25 (the faiss wiki reports 55 s on one P100; bench.kmeans runs it "
         "when faiss sees a GPU)"),
        ("Tiny pipeline on CUDA",
         "the tiny MCL pipeline (stages, export, k-means, evaluation) end to end with device=cuda"),
    ]
    if torch.cuda.is_available():
        note = ("a GPU is visible but this module does not measure these rows: run them on the device machine "
                "(see BENCHMARKS.md's GPU section)")
    else:
        note = f"{NOT_LENT} (torch.cuda.is_available() is False on this machine)"
    return [Result(name=name, workload=workload, status="skipped", goal="context", notes=[note])
            for name, workload in rows]


# ---------------------------------------------------------------------------------------------------- 4. CLIP
CLIP_NAME = "Engine: CLIP fine-tuning vs open_clip_train (tiny model, CPU)"


def _clip_not_available(reason: str) -> Result:
    return Result(name=CLIP_NAME, workload="mclpipe-tiny-vit on tiny shards", status="not available",
                  goal="context", notes=[f"not measured: {reason}"])


class _CountingLoader:
    """open_clip's DataLoader with a clock: when each batch arrived (train_one_epoch only iterates it and reads
    num_batches / num_samples)."""

    def __init__(self, loader):
        self.loader = loader
        self.num_batches = loader.num_batches
        self.num_samples = loader.num_samples
        self.arrivals: list[float] = []
        self.samples = 0

    def __iter__(self):
        for images, texts in self.loader:
            self.arrivals.append(time.perf_counter())
            self.samples += len(images)
            yield images, texts


def steady_rate(arrivals: list[float], *, batch: int) -> float | None:
    """Samples/s from the first batch's arrival in the loop to the last's: the rate once running, without the
    start (workers, first decode, first step); None with fewer than 2 batches."""
    if len(arrivals) < 2 or arrivals[-1] <= arrivals[0]:
        return None
    return (len(arrivals) - 1) * batch / (arrivals[-1] - arrivals[0])


#: open_clip_train's --precision for ours: the same autocast on both sides.
OPEN_CLIP_PRECISION = {"fp32": "fp32", "bf16": "amp_bf16"}


def clip_runs(*, work: Path, clip_spec, urls: list[str], device: str, precision: str, batch: int, steps: int,
              rounds: int, warmup_steps: int, threads: int, workers: int = 0) -> dict[str, list[dict]]:
    """Our CLIP stage and open_clip_train's ``train_one_epoch`` on the same shards (``urls``), model and init
    (``clip_spec``), transform, tokenizer, AdamW settings, ``batch``, ``steps``, ``device`` and autocast
    (``precision`` fp32 or bf16, open_clip's fp32 / amp_bf16); each warmed up with a ``warmup_steps`` run of its
    own, then ``rounds`` interleaved epochs of each (A B, B A, ...). Returns {"ours": [summaries], "open_clip":
    [{seconds, samples, batches, samples_per_second, first_batch_s}]}; our ``seconds`` and ``samples_per_second``
    leave out the stage's checkpoint writes (``train_one_epoch`` writes none; with them:
    ``samples_per_second_with_checkpoint``). Used by the CPU row here and by
    ``make gpu-check`` (bench/gpu_check.py) with ViT-B-32 on a GPU."""
    import types

    import open_clip
    import open_clip_train.data as open_clip_data
    import torch
    import webdataset as wds
    from open_clip_train.scheduler import cosine_lr
    from open_clip_train.train import train_one_epoch

    from contrastive.engine.optim import excluded_from_decay
    from contrastive.engine.task import LoopSpec, OptimSpec
    from contrastive.modalities.image_text.model import create_clip, register_model_configs
    from contrastive.modalities.image_text.steps import ClipStageSpec, train_stage

    # As in bench.shards: open_clip's tarfile_to_samples_nothrow needs webdataset <= 0.2.86; its own source names
    # this replacement on that line.
    open_clip_data.tarfile_to_samples_nothrow = wds.tarfile_to_samples(handler=open_clip_data.log_and_continue)
    register_model_configs()
    lr, weight_decay, betas, eps = 5e-5, 0.2, (0.9, 0.98), 1e-6

    def ours_spec(name: str, max_steps: int | None):
        return ClipStageSpec(
            stage_dir=str(work / name), seed=0, device=device, threads=threads, clip=clip_spec.to_dict(), urls=urls,
            grouped_dir=None, global_batch_size=batch, decode_workers=workers,
            optim=OptimSpec(name="adamw", lr=lr, weight_decay=weight_decay, schedule="cosine", betas=betas, eps=eps),
            loop=LoopSpec(epochs=1, checkpoint_every_steps=500, log_every_steps=10, precision=precision,
                          max_steps_per_epoch=max_steps))

    def ours_epoch(name: str) -> dict:
        arrivals = _Arrivals()
        started = time.perf_counter()
        summary = train_stage(ours_spec(name, None), callbacks=[arrivals])
        # train_one_epoch writes no checkpoint (open_clip_train's main does, after it): both sides are timed
        # without one. Ours (ViT-B-32's 6 trained blocks with their AdamW state, ~0.5 GB) is an estimated 1.5 s at
        # the checkpoint row's 0.33 GB/s on an H200 host, most of the 2.2 s an epoch by which the first
        # comparison (2026-11-26, checkpoint included) trailed: a cost of checkpointing, not of training.
        seconds = summary["seconds"] - summary["checkpoint_seconds"]
        samples = summary["samples_per_second"] * summary["seconds"]
        # From the loop's start (the model made, as open_clip's side makes its own before its clock) to the first
        # batch in the loop: the decode pool's start and first chunks.
        loop_started = arrivals.loop_started if arrivals.loop_started is not None else started
        return {**summary, "seconds": seconds, "samples_per_second": samples / seconds,
                "samples_per_second_with_checkpoint": summary["samples_per_second"],
                "first_batch_s": arrivals.times[0] - loop_started if arrivals.times else None,
                "steady_samples_per_second": steady_rate(arrivals.times, batch=batch)}

    def open_clip_epoch(limit: int) -> dict:
        bundle = create_clip(spec=clip_spec, device=device)
        model = bundle.model
        model.output_dict = True  # open_clip_train creates its model with output_dict=True
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            [{"params": [p for n, p in named if excluded_from_decay(n, p)], "weight_decay": 0.0},
             {"params": [p for n, p in named if not excluded_from_decay(n, p)], "weight_decay": weight_decay}],
            lr=lr, betas=betas, eps=eps)
        args = types.SimpleNamespace(
            train_data="::".join(urls), train_num_samples=limit * batch, dataset_resampled=False,
            train_data_upsampling_factors=None, seed=0, batch_size=batch, workers=workers, world_size=1, rank=0,
            local_rank=0, device=device, precision=OPEN_CLIP_PRECISION[precision], distill=False, accum_freq=1,
            skip_scheduler=False, grad_clip_norm=None, horovod=False, log_every_n_steps=100, wandb=False)
        data = open_clip_data.get_wds_dataset(args, bundle.train_transform, is_train=True, epoch=0,
                                              tokenizer=bundle.tokenizer)
        loader = _CountingLoader(data.dataloader)
        data.dataloader = loader
        scheduler = cosine_lr(optimizer, lr, 0, limit)
        loss = open_clip.ClipLoss()
        started = time.perf_counter()
        train_one_epoch(model, {"train": data}, loss, 0, optimizer, None, scheduler, None, args)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        return {"seconds": seconds, "samples": loader.samples, "batches": len(loader.arrivals),
                "samples_per_second": loader.samples / seconds,
                "first_batch_s": loader.arrivals[0] - started if loader.arrivals else None,
                "steady_samples_per_second": steady_rate(loader.arrivals, batch=batch)}

    train_stage(ours_spec("ours-warmup", warmup_steps))
    open_clip_epoch(warmup_steps)
    candidates = {"ours": lambda n: ours_epoch(f"ours-{n}"), "open_clip": lambda n: open_clip_epoch(steps)}
    runs: dict[str, list[dict]] = {"ours": [], "open_clip": []}
    for round_number in range(rounds):
        for name in (list(candidates) if round_number % 2 == 0 else list(candidates)[::-1]):
            record = candidates[name](round_number)
            runs[name].append(record)
            log(f"engine: CLIP {name} {record['samples_per_second']:.0f} samples/s in {record['seconds']:.2f} s")
    return runs


def clip_vs_open_clip(*, quick: bool, work: Path) -> Result:
    """Our CLIP stage (``contrastive.modalities.image_text.steps.train_stage``, random batches = stage 0) against open_clip_train's
    ``train_one_epoch`` on the same shards, model (``create_clip``: same init, same frozen parameters), transform,
    tokenizer, AdamW settings, batch and number of steps; decoding on the training thread on both sides."""
    try:
        import open_clip_train  # noqa: F401
    except ImportError as exc:
        return _clip_not_available(f"open_clip_train could not be imported ({exc})")
    import torch

    from contrastive.modalities.image_text.data import write_tiny_shards
    from contrastive.modalities.image_text.model import TINY_MODEL, ClipSpec, create_clip

    num_samples = 1_024 if quick else 2_048
    per_shard = 128
    clip_spec = ClipSpec(model_name=TINY_MODEL, trainable_image_blocks=2)
    shards = write_tiny_shards(directory=work / "shards", num_samples=num_samples, samples_per_shard=per_shard,
                               image_size=64, corrupt=False)
    urls = shards["urls"]
    torch.set_num_threads(THREADS)
    steps = num_samples // BATCH
    runs = clip_runs(work=work, clip_spec=clip_spec, urls=urls, device="cpu", precision="fp32", batch=BATCH,
                     steps=steps, rounds=ROUNDS, warmup_steps=WARMUP_STEPS, threads=THREADS)
    assert all(r["steps"] == steps for r in runs["ours"]) and all(r["batches"] == steps for r in runs["open_clip"])
    ours = {key: median([r[key] for r in runs["ours"]]) for key in ("seconds", "samples_per_second", "first_batch_s")}
    theirs = {key: median([r[key] for r in runs["open_clip"]])
              for key in ("seconds", "samples_per_second", "first_batch_s")}
    ratio = ours["samples_per_second"] / theirs["samples_per_second"]
    trainable = sum(p.numel() for p in create_clip(spec=clip_spec).model.parameters() if p.requires_grad)
    return Result(
        name=CLIP_NAME,
        workload=(f"{TINY_MODEL} (2-layer ViT width 64, 32 px; text tower locked, {fmt_count(trainable)} trainable "
                  f"parameters), {fmt_count(num_samples)} samples in {len(urls)} tiny shards (64 px JPEG), batch "
                  f"{BATCH}, 1 epoch ({steps} steps), AdamW + cosine, fp32, CPU, {THREADS} torch thread(s), "
                  "decoding on the training thread"),
        baseline="open_clip_train.train.train_one_epoch + open_clip_train.data.get_wds_dataset (train mode; tar "
                 "reader swapped as in bench.shards)",
        baseline_s=theirs["seconds"], ours_s=ours["seconds"], ratio=ratio,
        ratio_note=f"samples/s ratio, median of {ROUNDS} runs each", goal="context", passed=None,
        notes=[f"samples/s (median of {ROUNDS} interleaved runs of {steps} steps): ours "
               f"{ours['samples_per_second']:.0f} (runs "
               + ", ".join(f"{r['samples_per_second']:.0f}" for r in runs["ours"]) + "), open_clip_train "
               f"{theirs['samples_per_second']:.0f} (runs "
               + ", ".join(f"{r['samples_per_second']:.0f}" for r in runs["open_clip"]) + ")",
               "same model and init (contrastive.modalities.image_text.model.create_clip, same frozen parameters), open_clip's train "
               "transform and tokenizer, AdamW(betas 0.9/0.98, eps 1e-6, weight decay 0.2 off biases/norms/"
               "logit scale), cosine schedule without warm-up; ours: the engine's clock around its epoch (also "
               "the end-of-epoch checkpoint), open_clip: train_one_epoch's wall time",
               f"time to the first batch (shuffle buffers filling): ours {ours['first_batch_s']:.2f} s, open_clip "
               f"{theirs['first_batch_s']:.2f} s; shuffle buffers at each one's default (ours 1000 samples, "
               "open_clip 5000 with 1000 initial)",
               f"each side warmed up with a {WARMUP_STEPS}-step run of its own first; writing the shards is not "
               "timed"],
        details={"runs": runs})


# ---------------------------------------------------------------------------------------------------- entry
def run(*, quick: bool) -> list[Result]:
    work = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    LOAD_AT_START[0] = threads_note()
    try:
        results = unimodal(quick=quick, work=work / "unimodal")
        results += gpu_rows()
        try:
            results.append(clip_vs_open_clip(quick=quick, work=work / "clip"))
        except Exception as exc:  # noqa: BLE001 - a failing comparison is a row saying why
            import traceback

            traceback.print_exc()
            results.append(_clip_not_available(f"the comparison failed: {type(exc).__name__}: {exc}"))
        return results
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    module_main(run)
