"""`make gpu-check`: the acceptance rows of a CUDA machine (issue 24), each against a baseline measured side by
side in the same invocation, written into BENCHMARKS.md with the device and the date.

Rows (``--rows`` picks some):

- ``pipeline``: the tiny pipeline end to end with ``device=cuda`` (must pass): wall time and where it trained
  (the ``environment`` every stage records: device, backend, torch / CUDA / driver, GPU).
- ``simclr``: ResNet-50 SimCLR, bf16, channels_last, synthetic 224 px views, the engine's loop against a plain
  PyTorch loop with the same model, loss, optimizer, autocast and memory format; compile off and on: images/s
  ratio (goal >= 1.0x) and MFU.
- ``kmeans``: k-means of 1M x 256 points, K = 20,000 and K = 10, on the GPU (faiss-gpu where faiss sees the GPU,
  else torch: ``contrastive.mcl.lloyd_torch``) against faiss-cpu on the same data from the same seeds: seconds and
  the AMI between the two assignments (faiss's wiki: 55 s for K = 20,000 on one P100).
- ``host_syncs``: host reads per training step of the engine outside logging (goal <= 1).
- ``ddp``: DDP equivalence under NCCL: a unimodal MCL stage (SimCLR, global batch norm, negatives gathered with
  their gradient) and a CLIP stage (tiny ViT), 2 processes against 1 with the same global batch: max loss and
  weight difference. Needs 2 GPUs ("not measured: needs 2 GPUs" with one).
- ``clip``: CLIP ViT-B-32 fine-tuning under bf16 autocast, our CLIP stage against ``open_clip_train``'s
  ``train_one_epoch`` on the same shards, batch, steps and GPU (bench/engine_throughput.py ``clip_runs``, the
  runner of the CPU row), 4 and 12 decoders a side: samples/s ratio (goal >= 1.0x); then ViT-L-14 as the CC12M
  preset trains it (random init, bf16, batch 1024, 30 steps, no decoding): its samples/s and the preset's
  training hours on 8 GPUs from it.
- ``export``: ResNet-50 embeddings of synthetic uint8 images, fp32 and bf16, through the export loop
  (``contrastive.embeddings.compute_embeddings``: pinned non-blocking copies, inference mode, one read a batch)
  against a model-only inference loop (the same model on inputs already on the GPU): images/s.
- ``checkpoint``: the stall of a checkpoint per step of ResNet-50 SimCLR with SGD momentum: seconds a save
  takes on rank 0 (serialise, hash the payload, write, fsync, rotate), the time every rank waits for it.
- ``input``: a ResNet-50 SimCLR stage (bf16, channels_last, batch 256, SimCLR's augmentation) trained through
  ``train_stage`` from a folder of 500 x 375 JPEGs stored as files (decoded at 224 px in DataLoader workers),
  with 4, 8 and 16 workers: views/s and the share of the stage the GPU waited for the next batch (the engine's
  ``data_wait_share``, worker start-up included); the ``simclr`` row's synthetic views are the GPU-bound rate.

- ``table4``: the MCL paper's Table 4 quick preset (``paper_table4_trifeature_quick``) end to end with
  ``device=cuda``: its probe table beside the paper's, each stage's rate, the full preset's time from it.

On a machine without CUDA every row prints "not measured: no CUDA device" and the command exits 0, so CI runs
it. A row's GPU sizes are its function's defaults (docs/gpu.md says how long each command takes); the report is
rewritten after every row, so a run stopped part way keeps the rows it finished (``--rows`` runs the rest).
``--dry-run`` (``make gpu-check DRY=1``) checks those sizes (:func:`check_sizes`), then runs every row on the CPU
at ``DRY_SIZES`` through the same functions into a temporary report: what a CPU can catch fails there, not on a
lent GPU.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import inspect
import json
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from bench.common import replace_section
from contrastive.engine.ports import free_port
from contrastive.engine.task import StageTask

ROWS = ("pipeline", "simclr", "kmeans", "host_syncs", "ddp", "clip", "export", "checkpoint", "input", "table4")
#: Points the k-means row's AMI between the GPU's and the CPU's assignments is computed on.
AMI_SAMPLE = 100_000
#: DataLoader workers the ``input`` row feeds the GPU with (issue 25: 4, 8 and 16).
INPUT_WORKERS = (4, 8, 16)
#: Dense bf16 tensor-core peak (FLOP/s) by device-name fragment, for MFU.
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12}
#: ResNet-50 at 224 px: 4.1 GMACs a forward pass = 8.2 GFLOP; a training step ~3x (forward + backward).
RESNET50_TRAIN_FLOP_PER_IMAGE = 3 * 8.2e9
MARK_BEGIN, MARK_END = "<!-- gpu-check:begin -->", "<!-- gpu-check:end -->"


@dataclass
class Row:
    name: str
    baseline: str
    figures: dict[str, str] = field(default_factory=dict)
    status: str = "ok"  # ok | not measured | failed


# ---------------------------------------------------------------------------------------------------- simclr
def simclr_parts(*, arch: str, device: torch.device, projection_dim: int = 128):
    """(model, optimizer) of SimCLR on a torchvision ResNet: backbone with its classifier replaced by a 2-layer
    projection head, channels_last, on ``device`` (the same for ours and the baseline), and SGD with Nesterov
    momentum (the baseline's optimizer)."""
    import torchvision
    backbone = getattr(torchvision.models, arch)(weights=None)
    width = backbone.fc.in_features
    backbone.fc = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                      torch.nn.Linear(width, projection_dim))
    model = backbone.to(device, memory_format=torch.channels_last)
    # Nesterov: the engine's "sgd" (contrastive.engine.optim.build_optimizer), so both loops take the same steps
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)


def plain_simclr_steps(*, arch: str, device: torch.device, views: tuple[torch.Tensor, torch.Tensor], steps: int,
                       compile: bool, losses: list[float] | None = None) -> float:
    """The baseline: a plain loop a competent user writes (bf16 autocast, channels_last, set_to_none), images/s
    over ``steps`` after a warm-up step. ``losses``, when given, receives every step's loss (the warm-up's first),
    read after the timed steps."""
    from contrastive.methods.losses import nt_xent
    model, opt = simclr_parts(arch=arch, device=device)
    forward = torch.compile(model) if compile else model
    kept: list[torch.Tensor] = []

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = nt_xent(z1=forward(views[0]), z2=forward(views[1]), temperature=0.2)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if losses is not None:
            kept.append(loss.detach())
    rate = _images_per_second(step, steps=steps, images=2 * len(views[0]), device=device)
    if losses is not None:
        losses.extend(float(loss) for loss in kept)
    return rate


class _SyntheticViews:
    """A batch source of the same two view tensors every step (no input cost: the model side alone)."""

    def __init__(self, views: tuple[torch.Tensor, torch.Tensor], steps: int):
        self.views, self.steps = views, steps

    def __len__(self) -> int:
        return self.steps

    def batches(self, *, epoch: int, start: int):
        for _ in range(start, self.steps):
            yield _ViewBatch(self.views)


@dataclass
class _ViewBatch:
    views: tuple[torch.Tensor, torch.Tensor]

    def __len__(self) -> int:
        return len(self.views[0])

    def take(self, n: int) -> "_ViewBatch":
        return _ViewBatch((self.views[0][:n], self.views[1][:n]))

    @property
    def keys(self) -> list[str]:
        return [str(i) for i in range(len(self))]


def engine_simclr_steps(*, arch: str, device: torch.device, views: tuple[torch.Tensor, torch.Tensor], steps: int,
                        compile: bool, work: Path, losses: list[float] | None = None) -> float:
    """Ours: the same model and loss through ``contrastive.engine.loop.train`` (bf16, channels_last, its
    checkpoint at the end only), images/s over the run's steady part. ``losses``, when given, receives every
    step's loss (the warm-up's first), as the loop logs it."""
    from contrastive.engine.loop import train
    from contrastive.engine.task import LoopSpec, OptimSpec, StageTask
    from contrastive.methods.losses import nt_xent
    model, _ = simclr_parts(arch=arch, device=device)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, view1, view2):
            return nt_xent(z1=self.model(view1), z2=self.model(view2), temperature=0.2), {}

    class Task(StageTask):
        def __init__(self):
            self.model = Step()

        def forward_module(self):
            return self.model

        def inputs(self, batch, *, device, step):
            return {"view1": batch.views[0], "view2": batch.views[1]}

    arrivals: list[float] = []

    class Clock:
        def on_step(self, *, step, epoch, metrics):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            arrivals.append(time.perf_counter())
            if losses is not None:
                losses.append(metrics["train/loss"])

        def on_epoch_end(self, **_):
            pass

        def on_checkpoint(self, **_):
            pass
    train(task=Task(), source=_SyntheticViews(views, steps + 1),
          optim=OptimSpec(name="sgd", lr=0.1, momentum=0.9, schedule="constant"),
          loop=LoopSpec(epochs=1, precision="bf16", channels_last=True, compile=compile, log_every_steps=1,
                        checkpoint_every_steps=10 ** 9, stall_seconds=None),
          device=device, checkpoint_path=work / "simclr" / "last.pt", callbacks=[Clock()])
    # from the end of the warm-up step to the end of the last: the same span the baseline times
    return 2 * len(views[0]) * (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])


def _images_per_second(step: Callable[[], None], *, steps: int, images: int, device: torch.device) -> float:
    step()  # warm-up: cuDNN autotuning, compilation
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return images * steps / (time.perf_counter() - started)


def device_name(device: torch.device) -> str:
    """What the report calls ``device``: the GPU's name, or "cpu"."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def mfu(*, images_per_second: float, device_name: str) -> float | None:
    """Model FLOPs utilisation of ResNet-50 training: achieved FLOP/s over the device's dense bf16 peak."""
    peak = next((value for fragment, value in PEAK_BF16.items() if fragment in device_name), None)
    return None if peak is None else images_per_second * RESNET50_TRAIN_FLOP_PER_IMAGE / peak


def simclr_row(*, device: torch.device, work: Path, arch: str = "resnet50", batch: int = 256, steps: int = 30,
               image_size: int = 224, compiles: tuple[bool, ...] = (False, True)) -> Row:
    check_sizes("simclr", batch=batch, steps=steps)
    views = tuple(torch.randn(batch, 3, image_size, image_size, device=device).contiguous(
        memory_format=torch.channels_last) for _ in range(2))
    from contrastive.engine.precision import configure_cuda_numerics
    # the engine turns on TF32 and cuDNN's autotuner (process-wide) when it starts: the baseline gets them first
    configure_cuda_numerics(device=device, tf32=True, cudnn_benchmark=True)
    row = Row(name="simclr", baseline="plain PyTorch loop, same model / loss / SGD / bf16 autocast / channels_last "
                                      "/ TF32 / cuDNN autotuner")
    name = device_name(device)
    for compile in compiles:
        theirs = plain_simclr_steps(arch=arch, device=device, views=views, steps=steps, compile=compile)
        ours = engine_simclr_steps(arch=arch, device=device, views=views, steps=steps, compile=compile,
                                   work=work / f"compile{int(compile)}")
        utilisation = mfu(images_per_second=ours, device_name=name)
        row.figures[f"compile {'on' if compile else 'off'}"] = (
            f"{ours:,.0f} vs {theirs:,.0f} img/s = {ours / theirs:.2f}x"
            + (f", MFU {100 * utilisation:.0f}%" if utilisation is not None else ""))
    return row


# ---------------------------------------------------------------------------------------------------- k-means
def clustered_points(*, num: int, dim: int, centers: int, seed: int = 0):
    """float32 (num, dim) points around ``centers`` random centres (k-means has structure to find)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((centers, dim)).astype(np.float32)
    return means[rng.integers(0, centers, num)] + 0.5 * rng.standard_normal((num, dim)).astype(np.float32)


def kmeans_row(*, num: int = 1_000_000, dim: int = 256, ks: tuple[int, ...] = (20_000, 10),
               compared: int = 100_000, on_gpu: bool = True) -> Row:
    """GPU k-means of ``num`` points at each K (the faiss wiki's scale: 1M x 256, K = 20,000), then GPU against
    faiss-cpu from the same seeds on the first ``compared`` points: faiss-cpu at 1M x 20,000 takes minutes on 16
    cores, more than a lease's command allows. ``on_gpu=False`` (the dry run) puts faiss-cpu on both sides."""
    import faiss
    import numpy as np

    from contrastive.mcl.clustering import adjusted_mutual_information, kmeans
    row = Row(name="kmeans", baseline="faiss-cpu on the same points from the same seeds (faiss wiki: K=20,000 in "
                                      "55 s on a P100)")
    check_sizes("kmeans", num=num, ks=ks, compared=compared)
    faiss_gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if on_gpu and faiss_gpus == 0 and not torch.cuda.is_available():
        row.status = "not measured"
        row.figures["why"] = ("no GPU for k-means: faiss sees none and torch has no CUDA device (faiss-gpu or a CUDA "
                              "build of torch: docs/gpu.md)")
        return row
    points = clustered_points(num=num, dim=dim, centers=1000)

    def timed(features, *, k: int, on_gpu: bool):
        started = time.perf_counter()
        result = kmeans(features=features, k=k, seed=0, niter=20, spherical=False, use_gpu=on_gpu, init="random")
        return result, time.perf_counter() - started

    for k in ks:
        full, full_seconds = timed(points, k=k, on_gpu=on_gpu)
        gpu, gpu_seconds = timed(points[:compared], k=k, on_gpu=on_gpu)
        cpu, cpu_seconds = timed(points[:compared], k=k, on_gpu=False)
        # sklearn's AMI grows with K x N on one thread (minutes at 100k x 20,000): a seeded sample of points
        sample = np.random.default_rng(0).choice(compared, size=min(compared, AMI_SAMPLE), replace=False)
        ami = adjusted_mutual_information(a=gpu.assignments[sample], b=cpu.assignments[sample])
        row.figures[f"K={k:,}"] = (
            f"GPU ({full.backend}) {num:,} points: {full_seconds:.1f} s (20 iterations); on {compared:,} points GPU "
            f"{gpu_seconds:.1f} s vs faiss-cpu {cpu_seconds:.1f} s = {cpu_seconds / gpu_seconds:.1f}x, AMI "
            f"{ami:.3f} (on {sample.size:,} points)")
    return row


# ---------------------------------------------------------------------------------------------------- the rest
def pipeline_command(*, preset: str, overrides: tuple[str, ...], work: Path) -> list[str]:
    """``python -m flows.cli run PRESET`` with ``overrides`` and everything it writes under ``work``: the
    `mclpipe` script beside the interpreter is the same CLI, but ``-m`` also runs where the project is importable
    without being pip-installed (a GPU node's system Python, PYTHONPATH=.)."""
    settings = [*overrides, f"output_dir={work / 'runs'}", f"data.cache_dir={work / 'data'}",
                f"tracking.uri=sqlite:///{work / 'mlflow.db'}"]
    return [sys.executable, "-m", "flows.cli", "run", preset, *(a for s in settings for a in ("--set", s))]


def run_pipeline(row: Row, *, preset: str, overrides: tuple[str, ...], work: Path) -> dict | None:
    """Run ``preset`` end to end in a process of its own (row checks first: :func:`check_sizes`); the wall time goes
    into ``row``. Returns the pipeline's ``summary.json`` (its results table), or None with ``row`` failed and the
    run's last lines printed."""
    check_sizes(row.name, preset=preset, overrides=overrides)
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    done = subprocess.run(pipeline_command(preset=preset, overrides=overrides, work=work), capture_output=True,
                          text=True, cwd=work)
    row.figures["wall time"] = f"{time.perf_counter() - started:.0f} s"
    if done.returncode != 0:
        row.status = "failed"
        row.figures["error"] = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        # the table keeps one line; the terminal gets the run's own last lines to debug it from
        print(f"{row.name} row failed; the run's last output:\n" + "\n".join(
            (done.stdout + done.stderr).strip().splitlines()[-60:]), flush=True)
        return None
    return json.loads(next((work / "runs" / "pipelines").glob("*/summary.json")).read_text())


def pipeline_row(*, work: Path, preset: str = "trifeature_tiny", overrides: tuple[str, ...] = ("device=cuda",)
                 ) -> Row:
    row = Row(name="pipeline", baseline="must pass")
    if run_pipeline(row, preset=preset, overrides=overrides, work=work) is None:
        return row
    summary = next((work / "runs" / "steps").glob("train0-*/train_summary.json"))
    row.figures["trained on"] = ", ".join(f"{k} {v}" for k, v in json.loads(summary.read_text())["environment"].items())
    return row


#: The MCL paper's Table 4 at tau 0.5 (Trifeature, linear probe): SimCLR stage 0 -> MCL after 3 stages.
PAPER_TABLE4 = {"stage 0": {"shape": 0.44, "texture": 0.92, "color": 1.00},
                "MCL concat": {"shape": 0.75, "texture": 0.99, "color": 1.00}}
#: Epochs a stage of the full preset (paper_table4_trifeature.yaml, the paper's 200).
FULL_EPOCHS = 200


def table4_row(*, work: Path, preset: str = "paper_table4_trifeature_quick",
               overrides: tuple[str, ...] = ("device=cuda",), full_epochs: int = FULL_EPOCHS) -> Row:
    """The Table 4 quick preset end to end (outcome 9): its linear-probe table beside the paper's, each training
    stage's rate, and from that rate how long the full preset (``full_epochs`` a stage) trains on 1 and on 8 GPUs
    (8: the rate times 8, ideal data-parallel scaling, an upper bound)."""
    row = Row(name="table4", baseline="the paper's Table 4, tau 0.5: shape 0.44 -> 0.75, texture 0.92 -> 0.99, "
                                      "color 1.00 -> 1.00 (200 epochs a stage)")
    summary = run_pipeline(row, preset=preset, overrides=overrides, work=work)
    if summary is None:
        return row
    for name in ("stage 0", "MCL concat", "control concat"):
        got = summary["results"].get(name, {})
        paper = PAPER_TABLE4.get(name)
        row.figures[name] = ", ".join(
            f"{attribute} {got.get(f'probe/{attribute}', float('nan')):.2f}"
            + (f" (paper {paper[attribute]:.2f})" if paper else "") for attribute in ("shape", "texture", "color"))
    stages = [json.loads(path.read_text()) for path in sorted((work / "runs" / "steps").glob("train*-*/"
                                                                                             "train_summary.json"))]
    training = sum(stage["seconds"] for stage in stages)
    per_epoch = sum(stage["seconds"] / stage["epochs"] for stage in stages)
    row.figures["training"] = (
        f"{len(stages)} stages of {stages[0]['epochs']} epochs, {training:.0f} s in all, "
        + ", ".join(f"{stage['views_per_second']:,.0f}" for stage in stages) + " views/s a stage on "
        + str(stages[0]["environment"].get("gpu", stages[0]["environment"]["device"])))
    row.figures[f"full preset ({full_epochs} epochs a stage), training alone"] = (
        f"{per_epoch * full_epochs / 3600:.1f} h on 1 GPU, {per_epoch * full_epochs / 8 / 3600:.1f} h on 8 "
        "(ideal scaling)")
    return row


READS = ("item", "__bool__", "__float__", "__int__", "tolist")  # each waits for the GPU's queued kernels


@dataclass
class _Rows:
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.x)

    def take(self, n: int) -> "_Rows":
        return _Rows(self.x[:n], self.y[:n])

    @property
    def keys(self) -> list[str]:
        return [str(i) for i in range(len(self))]


class RegressionRows:
    """``steps`` batches of 4 rows of a fixed linear regression, on ``device``."""

    def __init__(self, *, steps: int, device: torch.device):
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(4 * steps, 3, generator=gen).to(device)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5], device=device)
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def batches(self, *, epoch: int, start: int):
        for index in range(start, self.steps):
            yield _Rows(self.x[4 * index:4 * index + 4], self.y[4 * index:4 * index + 4])


class QuietLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 1)

    def forward(self, x, y):
        return ((self.linear(x).squeeze(1) - y) ** 2).mean(), {}


class QuietTask(StageTask):
    """A linear regression whose forward reads nothing on the host (no metrics): the loop's own reads count."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = QuietLoss()

    def forward_module(self):
        return self.model

    def inputs(self, batch, *, device, step):
        return {"x": batch.x, "y": batch.y}


def host_reads_per_step(*, device: torch.device, steps: int = 60, accumulation: int = 1) -> float:
    """Host reads (READS, patched to count) per optimizer step of the engine's loop on ``device``, outside
    logging and checkpointing; one epoch, so its end adds two (the epoch's mean loss and the last loss)."""
    from contrastive.engine.loop import train
    from contrastive.engine.task import LoopSpec, OptimSpec
    counts = {"n": 0}
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counted(original):
        def read(self, *args, **kwargs):
            counts["n"] += 1
            return original(self, *args, **kwargs)
        return read
    with tempfile.TemporaryDirectory() as work:
        for name, original in originals.items():
            setattr(torch.Tensor, name, counted(original))
        try:
            train(task=QuietTask(), source=RegressionRows(steps=steps * accumulation, device=device),
                  optim=OptimSpec(name="sgd", lr=0.01, schedule="constant"),
                  loop=LoopSpec(epochs=1, log_every_steps=10 ** 6, checkpoint_every_steps=10 ** 6,
                                grad_accumulation=accumulation), device=device, checkpoint_path=Path(work) / "last.pt")
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)
    return counts["n"] / steps


def host_syncs_row(*, device: torch.device, steps: int = 60) -> Row:
    return Row(name="host_syncs", baseline="goal <= 1 per step outside logging",
               figures={"reads per step": f"{host_reads_per_step(device=device, steps=steps):.2f}"})


# ---------------------------------------------------------------------------------------------------- input
def input_stage_spec(*, dataset_dir: Path, stage_dir: Path, workers: int, device: str, batch: int, steps: int,
                     arch: str = "resnet50", precision: str = "bf16", epochs: int = 1, log_every_steps: int = 10,
                     resample_on_gpu: bool = False):
    """SimCLR from an image folder as a user trains it: ``arch`` (the ImageNet stem for a ResNet; any other name a
    small CNN, for a CPU test), SimCLR's crop / flip / colour jitter / grayscale, SGD, ``precision`` autocast,
    channels_last, ``epochs`` of ``steps`` steps of the global ``batch`` read by ``workers`` DataLoader workers
    (``resample_on_gpu``: ``train.resample_on_gpu``, the GPU resampling the decoded squares)."""
    from contrastive.engine.task import LoopSpec, OptimSpec
    from contrastive.modalities.image.steps import ImageStageSpec
    model = (dict(encoder=arch, stem="imagenet", projection_hidden=2048, projection_dim=128)
             if arch.startswith("resnet") else dict(encoder="small_cnn", widths=[8, 16], projection_hidden=16,
                                                      projection_dim=8))
    return ImageStageSpec(
        dataset_dir=str(dataset_dir), stage_dir=str(stage_dir), pseudo_labels_path=None, model=model,
        method={"name": "simclr", "temperature": 0.2},
        augment=dict(crop_scale=(0.08, 1.0), crop_ratio=(3 / 4, 4 / 3), hflip=True, color_jitter=0.4,
                     color_jitter_p=0.8, grayscale_p=0.2),
        batch_size=batch, seed=0, device=device, remainder_policy="partial", workers=workers,
        resample_on_gpu=resample_on_gpu,
        # a rate plain SGD keeps finite on a ResNet-50 from scratch: the row times the stage, a NaN would end it
        optim=OptimSpec(name="sgd", lr=0.05, momentum=0.9, schedule="constant"),
        loop=LoopSpec(epochs=epochs, max_steps_per_epoch=steps, precision=precision, channels_last=True,
                      log_every_steps=log_every_steps, checkpoint_every_steps=10 ** 9))


class _Windows:
    """Training callback keeping each logging window's metrics (views/s, the share it waited for data)."""

    def __init__(self):
        self.windows: list[dict[str, float]] = []

    def on_step(self, *, step, epoch, metrics):
        self.windows.append({**metrics, "epoch": epoch})

    def on_epoch_end(self, **_):
        pass

    def on_checkpoint(self, **_):
        pass

    def split(self) -> tuple[list[dict], list[dict]]:
        """(windows inside an epoch, the first window of every epoch): an epoch's first batches wait for the
        persistent workers to be handed the new epoch's plan (one batch decoded by one worker, not all of them)."""
        inside, starts, seen = [], [], set()
        for window in self.windows:
            (inside if window["epoch"] in seen else starts).append(window)
            seen.add(window["epoch"])
        return inside, starts


def _mean(windows: list[dict], key: str) -> float:
    return sum(w[key] for w in windows) / max(len(windows), 1)


def input_row(*, device: torch.device, work: Path, workers: tuple[int, ...] = INPUT_WORKERS, batch: int = 256,
              steps: int = 16, image_size: int = 224, arch: str = "resnet50", precision: str = "bf16",
              epochs: int = 2, log_every_steps: int = 4, resample_workers: tuple[int, ...] = (8,)) -> Row:
    """The ``input`` row: one stage per worker count over the same ``batch * steps`` JPEGs (written once), each
    ``epochs`` epochs (workers persist across them), after an unreported warm-up stage (CUDA context, cuDNN's
    autotuning of every convolution shape: it made the first stage of the first H200 run, 4 workers, read 314
    views/s against 2,022 with 8). Per worker count: the steady rate and wait share (the logging windows after the
    first of each epoch: the first holds the workers' start-up, a later epoch's first its hand-over), each epoch's
    first window's wait, and the stage's (start-up included).

    Then one stage per count of ``resample_workers`` with ``train.resample_on_gpu`` (the workers ship the decoded
    375 px squares, the GPU resamples them), and the pixels of one batch resampled on the device against the
    workers' (max and mean levels of 255; more than 2 levels apart fails the row: the CPU tests bound the float
    kernel on the CPU, this row CUDA's). On a CPU (the dry run) the stage would fall back to the workers, so the
    row resamples on the CPU instead (:func:`_resample_where_the_stage_runs`): the same code path as on a GPU."""
    from bench.image_input import write_jpegs
    from contrastive.modalities.image.datasets.image_folder import prepare_image_folder
    from contrastive.modalities.image.steps import train_stage
    check_sizes("input", steps=steps, log_every_steps=log_every_steps, workers=workers)
    folder = write_jpegs(work / "input" / "jpegs", num_images=batch * steps)
    dataset_dir = prepare_image_folder(source=folder, root=work / "input" / "data", image_size=image_size,
                                       storage="files", decode_scale="auto")
    row = Row(name="input", baseline=f"the simclr row's synthetic views (the GPU-bound rate); {batch * steps} JPEGs "
                                     f"500x375 -> {image_size} px, batch {batch}, {epochs} epochs of {steps} steps, "
                                     f"windows of {log_every_steps} steps")
    started = time.perf_counter()
    train_stage(input_stage_spec(dataset_dir=dataset_dir, stage_dir=work / "input" / "warmup", workers=workers[0],
                                 device=device.type, batch=batch, steps=min(steps, 2), arch=arch, precision=precision))
    row.figures["warm-up stage"] = f"{time.perf_counter() - started:.1f} s"
    for count, on_gpu in [*((c, False) for c in workers), *((c, True) for c in resample_workers)]:
        windows = _Windows()
        with _resample_where_the_stage_runs(device) if on_gpu else contextlib.nullcontext():
            summary = train_stage(input_stage_spec(
                dataset_dir=dataset_dir, stage_dir=work / "input" / f"w{count}{'_resample' if on_gpu else ''}",
                workers=count, device=device.type, batch=batch, steps=steps, arch=arch, precision=precision,
                epochs=epochs, log_every_steps=log_every_steps, resample_on_gpu=on_gpu), callbacks=[windows])
        inside, starts = windows.split()
        steady = inside or windows.windows
        epoch_starts = ", ".join(f"{100 * w['train/data_wait_share']:.0f}%" for w in starts)
        row.figures[f"{count} workers{', GPU resample' if on_gpu else ''}"] = (
            f"{_mean(steady, 'train/views_per_s'):,.0f} views/s, GPU waited for data "
            f"{100 * _mean(steady, 'train/data_wait_share'):.0f}% steady (inside epochs); epochs' first windows "
            f"waited {epoch_starts}; {summary['views_per_second']:,.0f} views/s, "
            f"{100 * summary['data_wait_share']:.0f}% over the stage (start-up included)")
    if resample_workers:
        largest, mean = resampled_pixel_difference(dataset_dir=dataset_dir, device=device, batch=batch)
        row.figures["GPU resample pixels"] = f"max {largest} levels, mean {mean:.4f} from the workers'"
        if largest > 2:
            row.status = "failed"
    return row


@contextlib.contextmanager
def _resample_where_the_stage_runs(device: torch.device):
    """On a CPU (the dry run) a stage with ``train.resample_on_gpu`` resamples in its workers (the fallback,
    ``contrastive.data.loading.resample_device``); here the reader resamples on the CPU instead, so the dry run goes
    through the GPU's code path (the squares shipped, the reader's resampling). On CUDA: nothing patched."""
    from unittest import mock
    if device.type == "cuda":
        yield
        return
    with mock.patch("contrastive.modalities.image.steps.resample_device",
                    lambda *, on_gpu, device: device if on_gpu else None):
        yield


def resampled_pixel_difference(*, dataset_dir: Path, device: torch.device, batch: int) -> tuple[int, float]:
    """(max, mean) absolute difference in levels of 255 between the first ``batch`` images resampled on ``device``
    (``BatchReader(resample_on=device)``) and by the workers' kernel, read in this process."""
    import numpy as np
    from contrastive.data.loading import iter_batches, load_dataset
    dataset = load_dataset(dataset_dir)
    plan = [np.arange(min(batch, len(dataset)))]
    (_, workers), = iter_batches(dataset, plan, workers=0)
    (_, ours), = iter_batches(dataset, plan, workers=0, resample_on=device)
    diff = (ours.cpu().to(torch.int16) - workers.to(torch.int16)).abs()
    return int(diff.max()), float(diff.float().mean())


# ---------------------------------------------------------------------------------------------------- ddp
DDP_WORLD = 2
#: The first step's loss of 1 process and of DDP_WORLD ranks: the same forward on the same data, to float32 rounding
#: on the CPU; on a GPU cuDNN's convolutions run in TF32 (torch's default) with algorithms picked per batch size.
FIRST_STEP_TOLERANCE = {"cpu": 1e-5, "cuda": 1e-3}


def image_stage_spec(*, dataset_dir: Path, stage_dir: Path, pseudo_labels: Path | None, device: str):
    """A unimodal MCL stage in seconds: SimCLR on a small CNN over Trifeature 32 px, cluster-pure batches from
    ``pseudo_labels``, global batch 32, 2 epochs, the loss of every step recorded (``record_keys``)."""
    from contrastive.engine.task import LoopSpec, OptimSpec
    from contrastive.modalities.image.steps import ImageStageSpec
    return ImageStageSpec(
        dataset_dir=str(dataset_dir), stage_dir=str(stage_dir),
        pseudo_labels_path=None if pseudo_labels is None else str(pseudo_labels),
        model=dict(encoder="small_cnn", widths=[8, 16], projection_hidden=16, projection_dim=8),
        method={"name": "simclr", "temperature": 0.5},
        augment=dict(crop_scale=(0.6, 1.0), crop_ratio=(0.75, 1.33), hflip=False, color_jitter=0.0),
        batch_size=32, seed=3, device=device, remainder_policy="partial",
        optim=OptimSpec(name="adam", lr=3e-3, weight_decay=0.0, schedule="constant", warmup_fraction=0.0),
        loop=LoopSpec(epochs=2, checkpoint_every_steps=100, log_every_steps=1, channels_last=False), threads=1,
        record_keys=True)


def clip_stage_spec(*, urls: list[str], stage_dir: Path, device: str):
    """A CLIP stage in seconds: the tiny ViT, global batch 32, 4 steps, every step's loss recorded."""
    from contrastive.engine.task import LoopSpec, OptimSpec
    from contrastive.modalities.image_text.model import TINY_MODEL, ClipSpec
    from contrastive.modalities.image_text.steps import ClipStageSpec
    return ClipStageSpec(
        stage_dir=str(stage_dir), seed=0, device=device, threads=1,
        clip=ClipSpec(model_name=TINY_MODEL, trainable_image_blocks=2).to_dict(), urls=urls, grouped_dir=None,
        global_batch_size=32, decode_workers=0, data_slots=DDP_WORLD,  # 1 and 2 processes read the same layout
        optim=OptimSpec(name="adamw", lr=5e-4, weight_decay=0.2, schedule="constant"),
        loop=LoopSpec(epochs=1, checkpoint_every_steps=100, log_every_steps=1, max_steps_per_epoch=4),
        record_keys=True)


def _ddp_rank(rank: int, world: int, port: int, entry: str, spec: dict, backend: str = "nccl") -> None:
    """One rank of a stage (spawned; module level so the child finds it): ``entry`` is the modality's
    ``train_stage_from_json``, as torchrun would call it; NCCL on GPU ``rank``, or gloo on the CPU (the dry run)."""
    import importlib
    import os

    import torch.distributed as dist

    from contrastive.engine.distributed import DistInfo
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "nccl":
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    else:
        torch.set_num_threads(1)
        dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        module, name = entry.rsplit(".", 1)
        getattr(importlib.import_module(module), name)(spec=spec, info=DistInfo(rank=rank, world_size=world,
                                                                                 local_rank=rank))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def stage_difference(*, single: Path, double: Path) -> dict[str, float]:
    """Max |loss difference| over the recorded steps and max |weight difference| of the saved models of one
    process and of 2 ranks (rank 0's record)."""
    from contrastive.engine.safe_load import load_torch_file
    import json as json_module
    one = json_module.loads((single / "keys_rank0.json").read_text())["losses"]
    two = json_module.loads((double / "keys_rank0.json").read_text())["losses"]
    if len(one) != len(two) or not one:
        raise RuntimeError(f"{len(one)} steps in one process, {len(two)} under DDP")
    weights = [_tensors(load_torch_file(run / "model" / "model.pt", what="trained model"))
               for run in (single, double)]
    shared = [key for key in weights[0] if key in weights[1] and weights[0][key].is_floating_point()]
    return {"steps": len(one), "first_loss": abs(one[0] - two[0]),
            "loss": max(abs(a - b) for a, b in zip(one, two)),
            "weight": max(float((weights[0][k] - weights[1][k]).abs().max()) for k in shared) if shared else float("nan")}


def _tensors(saved, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a saved model file by its dotted path (state dicts nested in whatever the file holds)."""
    if isinstance(saved, torch.Tensor):
        return {prefix: saved}
    if isinstance(saved, dict):
        return {k: v for key, value in saved.items() for k, v in _tensors(value, f"{prefix}{key}.").items()}
    return {}


def ddp_row(*, work: Path, device: str = "cuda") -> Row:
    """The DDP equivalence row on ``DDP_WORLD`` GPUs under NCCL; ``device="cpu"`` (the dry run): the same stages and
    comparison under gloo on the CPU."""
    import importlib

    import numpy as np
    import torch.multiprocessing as mp

    from contrastive.modalities.image.datasets.trifeature import prepare_trifeature
    from contrastive.modalities.image.steps import load_dataset
    from contrastive.modalities.image_text.data import write_tiny_shards
    row = Row(name="ddp", baseline="1 process with the same global batch (NCCL, global batch norm, gather_with_grad)")
    if device == "cuda" and torch.cuda.device_count() < DDP_WORLD:
        row.status = "not measured"
        row.figures["why"] = f"needs {DDP_WORLD} GPUs, {torch.cuda.device_count()} visible"
        return row
    dataset_dir = prepare_trifeature(root=work / "trifeature", num_train=256, num_test=16, image_size=32,
                                     num_colors=2, num_shapes=2, num_textures=2, seed=0)
    dataset = load_dataset(dataset_dir)
    train_ids = dataset.ids[dataset.indices("train")]
    np.savez(work / "pseudo.npz", ids=train_ids, groups=np.arange(train_ids.size) % 2)
    urls = write_tiny_shards(directory=work / "shards", num_samples=256, samples_per_shard=64, image_size=64,
                             corrupt=False)["urls"]
    stages = {"MCL stage": ("contrastive.modalities.image.steps.train_stage_from_json",
                            lambda d: image_stage_spec(dataset_dir=dataset_dir, stage_dir=d,
                                                       pseudo_labels=work / "pseudo.npz", device=device)),
              "CLIP stage": ("contrastive.modalities.image_text.steps.train_stage_from_json",
                             lambda d: clip_stage_spec(urls=urls, stage_dir=d, device=device))}
    for name, (entry, spec_for) in stages.items():
        single, double = work / f"{name}-1", work / f"{name}-2"
        module, function = entry.rsplit(".", 1)
        getattr(importlib.import_module(module), function)(spec=spec_for(single).to_json())
        mp.spawn(_ddp_rank, args=(DDP_WORLD, free_port(), entry, spec_for(double).to_json(),
                                  "nccl" if device == "cuda" else "gloo"), nprocs=DDP_WORLD, join=True)
        diff = stage_difference(single=single, double=double)
        # The first step's loss is the same forward on the same data: it agrees to float rounding or the ranks'
        # shares are wrong. Later steps drift apart as training amplifies the summation order's rounding (the MCL
        # stage on gloo: 0 at step 0, 7e-5 at step 1, 1.6e-2 by step 13 with Adam; 4.5e-6 at step 1 with SGD).
        row.figures[name] = (f"first-step loss difference {diff['first_loss']:.2e}, max loss difference "
                             f"{diff['loss']:.2e} over {diff['steps']} steps, max weight difference "
                             f"{diff['weight']:.2e}")
        if diff["first_loss"] > FIRST_STEP_TOLERANCE[device]:
            row.status = "failed"
    return row


# ---------------------------------------------------------------------------------------------------- clip
def clip_row(*, work: Path, model: str = "ViT-B-32", trainable_blocks: int = 6, image_size: int = 224,
             steps: int = 48, batch: int = 128, samples_per_shard: int = 256, rounds: int = 2,
             decoders: tuple[int, ...] = (4, 12), warmup_steps: int = 3, device: str = "cuda",
             precision: str = "bf16", large_model: str = "ViT-L-14-quickgelu", large_batch: int = 1024,
             large_steps: int = 30, large_image_size: int = 224) -> Row:
    """``model`` (seeded random init: no download on a GPU node) with its last ``trainable_blocks`` image blocks
    trained as the CLIP pipeline does, ``image_size`` px shards of ``samples_per_shard`` samples, ``precision``
    autocast on both sides; for each count in ``decoders`` our stage decodes in that many worker processes and
    open_clip_train in that many DataLoader workers. The sizes are checked first (:func:`check_sizes`: open_clip
    needs a shard a worker, and every worker the same whole batches), and each side must train ``steps`` batches.
    Then ``large_model`` as ``clip_cc12m_vitl14`` trains it, its rate alone (:func:`clip_model_rate`): what the
    CC12M cost in docs/clip.md is computed from."""
    from bench.engine_throughput import clip_runs
    from contrastive.modalities.image_text.data import write_tiny_shards
    from contrastive.modalities.image_text.model import ClipSpec
    check_sizes("clip", steps=steps, batch=batch, samples_per_shard=samples_per_shard, decoders=decoders)
    row = Row(name="clip", baseline="open_clip_train train_one_epoch, same shards / model / batch / steps / GPU; "
                                    "ours decoding in N worker processes, theirs in N DataLoader workers")
    urls = write_tiny_shards(directory=work / "clip-shards", num_samples=steps * batch,
                             samples_per_shard=samples_per_shard, image_size=image_size, corrupt=False)["urls"]

    for count in decoders:
        runs = clip_runs(work=work / f"clip-{count}",
                         clip_spec=ClipSpec(model_name=model, trainable_image_blocks=trainable_blocks), urls=urls,
                         device=device, precision=precision, batch=batch, steps=steps, rounds=rounds,
                         warmup_steps=warmup_steps, threads=count, workers=count)
        trained = {*(r["steps"] for r in runs["ours"]), *(r["batches"] for r in runs["open_clip"])}
        if trained != {steps}:
            raise RuntimeError(f"clip: the sides trained {sorted(trained)} batches with {count} decoders, not {steps}")
        ours = run_median(runs["ours"], "samples_per_second")
        theirs = run_median(runs["open_clip"], "samples_per_second")
        row.figures[f"{model}, batch {batch}, {steps} steps, {precision}, {count} decoders"] = (
            f"{ours:,.0f} vs {theirs:,.0f} samples/s = {ours / theirs:.2f}x (median of {rounds}; ours with its "
            f"end-of-epoch checkpoint, which train_one_epoch does not write: "
            f"{run_median(runs['ours'], 'samples_per_second_with_checkpoint'):,.0f} samples/s, "
            f"{run_median(runs['ours'], 'checkpoint_seconds'):.1f} s saving)")
        row.figures[f"{count} decoders, where the time goes"] = clip_time_split(runs)
    rate = clip_model_rate(model=large_model, batch=large_batch, steps=large_steps, image_size=large_image_size,
                           trainable_blocks=trainable_blocks, device=device, precision=precision)
    row.figures[f"{large_model}, the CC12M preset's step"] = clip_cost_figure(rate)
    return row


#: ``clip_cc12m_vitl14``: samples a stage (12M pairs x 20 epochs), stages, GPUs of the node.
CC12M_STAGE_SAMPLES, CC12M_STAGES, CC12M_GPUS = 240_000_000, 4, 8


def clip_model_rate(*, model: str, batch: int, steps: int, image_size: int, trainable_blocks: int, device: str,
                    precision: str, warmup: int = 5) -> dict:
    """Samples/s of ``model`` (seeded random init) trained as ``clip_cc12m_vitl14`` trains ViT-L-14 on one GPU: the
    last ``trainable_blocks`` image blocks, the text tower locked, gradient checkpointing, AdamW, ``precision``
    autocast, through the engine's loop (``train`` with :class:`ClipTask`), on one synthetic uint8 batch of
    ``batch`` normalised on the device: the model's rate without reading or decoding (the ``clip`` comparison
    above measures those). Steady: from the ``warmup``-th batch's arrival in the loop to the last's."""
    from bench.engine_throughput import _Arrivals, steady_rate
    from contrastive.engine.loop import release_device_memory, train
    from contrastive.engine.task import LoopSpec, OptimSpec
    from contrastive.modalities.image_text.adapter import ClipTask
    from contrastive.modalities.image_text.data import ClipBatch
    from contrastive.modalities.image_text.model import ClipSpec, create_clip
    from contrastive.modalities.image_text.steps import ClipBatchSource

    torch_device = torch.device(device)
    bundle = create_clip(spec=ClipSpec(model_name=model, trainable_image_blocks=trainable_blocks), device="cpu")
    bundle.model.set_grad_checkpointing(True)
    generator = torch.Generator().manual_seed(0)
    texts = [f"a photo of thing {i}" for i in range(batch)]
    one = ClipBatch(images=torch.randint(0, 256, (batch, 3, image_size, image_size), dtype=torch.uint8,
                                         generator=generator),
                    texts=texts, keys=[str(i) for i in range(batch)], tokens=bundle.tokenizer(texts),
                    normalization=((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)))
    if torch_device.type == "cuda":
        one.images, one.tokens = one.images.pin_memory(), one.tokens.pin_memory()
    arrivals = _Arrivals()
    with tempfile.TemporaryDirectory(prefix="clip-rate-") as tmp:
        train(task=ClipTask(bundle=bundle), source=ClipBatchSource(lambda epoch, start: (one for _ in range(steps)),
                                                                   steps),
              optim=OptimSpec(name="adamw", lr=1e-5, weight_decay=0.1, schedule="cosine"),
              loop=LoopSpec(epochs=1, checkpoint_every_steps=10 ** 9, log_every_steps=10 ** 9, precision=precision,
                            grad_clip_norm=1.0),
              device=torch_device, checkpoint_path=Path(tmp) / "last.pt", callbacks=[arrivals])
    release_device_memory(torch_device)
    times = arrivals.times[min(warmup, max(0, len(arrivals.times) - 2)):]
    return {"model": model, "batch": batch, "steps": len(arrivals.times), "precision": precision,
            "trainable_blocks": trainable_blocks, "samples_per_second": steady_rate(times, batch=batch)}


def clip_cost_figure(rate: dict) -> str:
    """The figure of :func:`clip_model_rate` and what it makes of ``clip_cc12m_vitl14``'s training: hours a stage
    and in all on ``CC12M_GPUS`` GPUs at ideal scaling (each GPU at this rate)."""
    per_second = rate["samples_per_second"] or float("nan")
    stage_hours = CC12M_STAGE_SAMPLES / (CC12M_GPUS * per_second) / 3600
    return (f"random init, last {rate['trainable_blocks']} image blocks trained, text locked, gradient checkpointing, "
            f"{rate['precision']}, batch {rate['batch']}, {rate['steps']} steps, synthetic batch (no decoding): "
            f"{per_second:,.0f} samples/s steady; clip_cc12m_vitl14 training ({CC12M_STAGE_SAMPLES / 1e6:.0f}M "
            f"samples a stage) on {CC12M_GPUS} such GPUs at ideal scaling: {stage_hours:.1f} h a stage, "
            f"{CC12M_STAGES * stage_hours:.1f} h for {CC12M_STAGES} stages")


def clip_time_split(runs: dict[str, list[dict]]) -> str:
    """What separates the two sides of a clip comparison: the rate once running (first batch to last in the
    loop), the start (call to first batch: workers, first decode, first step) and the share of our stage spent
    waiting for input. Medians over the rounds (:func:`run_median`)."""
    ours, theirs = (run_median(runs["ours"], "steady_samples_per_second"),
                    run_median(runs["open_clip"], "steady_samples_per_second"))
    return (f"steady {ours:,.0f} vs {theirs:,.0f} samples/s = {ours / theirs:.2f}x; first batch after "
            f"{run_median(runs['ours'], 'first_batch_s'):.2f} vs {run_median(runs['open_clip'], 'first_batch_s'):.2f}"
            f" s; ours waited for input {run_median(runs['ours'], 'data_wait_share'):.0%} of its stage")


def run_median(runs: list[dict], key: str) -> float:
    """The median of ``key`` over the runs that report it (the upper one of an even count: with 2 rounds, the
    larger value); nan when none does."""
    values = sorted(r[key] for r in runs if r.get(key) is not None)
    return values[len(values) // 2] if values else float("nan")


# ---------------------------------------------------------------------------------------------------- export
@dataclass
class ExportRun:
    """rows written; seconds of the whole call (pinned buffers, the writer's files and the device memory returned at
    the end included); steady: rows/s from the first batch written to the last, the loop's rate once running (what
    an export of a million images sees)."""
    rows: int
    seconds: float
    steady: float


def export_through_engine(*, model: torch.nn.Module, images: torch.Tensor, batch: int, device: torch.device,
                          precision: str, out_dir: Path) -> ExportRun:
    """The one adapter to the export loop (``contrastive.embeddings.compute_embeddings``): host uint8 images
    (N, 3, H, W) in batches of ``batch``, scaled to float on the device, embedded into float16 shards under
    ``out_dir``."""
    import numpy as np

    from contrastive.embeddings import EmbeddingWriter, ExportBatch, compute_embeddings
    written: list[tuple[float, int]] = []  # (when, rows) at each batch written
    started = time.perf_counter()
    writer = EmbeddingWriter(out_dir)
    batches = (ExportBatch(ids=np.arange(start, min(start + batch, len(images))),
                           inputs=(images[start:start + batch],)) for start in range(0, len(images), batch))
    compute_embeddings(encode=lambda x: model(x.float().div_(255).contiguous(memory_format=torch.channels_last)),
                       batches=batches, device=device, writer=writer, precision=precision,
                       progress=lambda rows, _dim: written.append((time.perf_counter(), rows)))
    rows = int(writer.finish()["ids"].size)
    seconds = time.perf_counter() - started
    after_first = sum(r for _, r in written[1:])
    steady = after_first / (written[-1][0] - written[0][0]) if len(written) > 1 else rows / seconds
    return ExportRun(rows=rows, seconds=seconds, steady=steady)


def model_only_images_per_second(*, model: torch.nn.Module, images: torch.Tensor, batch: int,
                                 device: torch.device, precision: str) -> float:
    """The baseline: the model alone on batches already on the device, same autocast and memory format."""
    from contrastive.engine.precision import autocast_context
    on_device = [images[s:s + batch].to(device) for s in range(0, len(images), batch)]
    with torch.inference_mode(), autocast_context(precision=precision, device=device):
        model(on_device[0].float().div_(255).contiguous(memory_format=torch.channels_last))  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        for x in on_device:
            model(x.float().div_(255).contiguous(memory_format=torch.channels_last))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return len(images) / (time.perf_counter() - started)


def resnet50_encoder(*, arch: str, device: torch.device) -> torch.nn.Module:
    """A torchvision ResNet without its classifier (2048-d embeddings for ResNet-50), eval, channels_last."""
    import torchvision
    model = getattr(torchvision.models, arch)(weights=None)
    model.fc = torch.nn.Identity()
    return model.eval().to(device, memory_format=torch.channels_last)


def export_row(*, device: torch.device, work: Path, num: int = 16_384, batch: int = 256, arch: str = "resnet50",
               size: int = 224) -> Row:
    check_sizes("export", num=num, batch=batch)
    row = Row(name="export", baseline="model-only inference loop on batches already on the GPU")
    images = torch.randint(0, 256, (num, 3, size, size), dtype=torch.uint8)
    model = resnet50_encoder(arch=arch, device=device)
    for precision in ("fp32", "bf16"):
        export_through_engine(model=model, images=images[:2 * batch], batch=batch, device=device,
                              precision=precision, out_dir=work / f"export-warmup-{precision}")
        ours = export_through_engine(model=model, images=images, batch=batch, device=device, precision=precision,
                                     out_dir=work / f"export-{precision}")
        theirs = model_only_images_per_second(model=model, images=images, batch=batch, device=device,
                                              precision=precision)
        row.figures[precision] = (f"steady {ours.steady:,.0f} vs {theirs:,.0f} img/s = {ours.steady / theirs:.2f}x; "
                                  f"whole call ({num:,} images, set-up and finish included) "
                                  f"{ours.rows / ours.seconds:,.0f} img/s = {ours.rows / ours.seconds / theirs:.2f}x")
    return row


# ---------------------------------------------------------------------------------------------------- checkpoint
def checkpoint_stall_seconds(*, arch: str, device: torch.device, path: Path, saves: int = 3) -> dict[str, float]:
    """What a checkpoint of a SimCLR ResNet with SGD momentum costs rank 0 (the other ranks wait that long at the
    next step's collective): median seconds of ``save_checkpoint`` over ``saves`` saves, and the file's MB."""
    from contrastive.engine.checkpoint import save_checkpoint
    model, opt = simclr_parts(arch=arch, device=device)
    model(torch.randn(2, 3, 64, 64, device=device).contiguous(memory_format=torch.channels_last)).sum().backward()
    opt.step()  # the momentum buffers exist, as in training
    seconds = []
    for step in range(saves):
        started = time.perf_counter()
        save_checkpoint({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
        seconds.append(time.perf_counter() - started)
    return {"seconds": sorted(seconds)[len(seconds) // 2], "mb": path.stat().st_size / 2 ** 20}


def checkpoint_row(*, device: torch.device, work: Path, arch: str = "resnet50", every_steps: int = 500) -> Row:
    row = Row(name="checkpoint", baseline="-")
    stall = checkpoint_stall_seconds(arch=arch, device=device, path=work / "checkpoint" / "last.pt")
    row.figures[f"{arch} + SGD momentum"] = (
        f"{stall['seconds']:.2f} s a save ({stall['mb']:.0f} MB), {1000 * stall['seconds'] / every_steps:.1f} ms a "
        f"step at train.checkpoint_every_steps {every_steps}")
    return row


# ---------------------------------------------------------------------------------------------------- report
def report_markdown(rows: list[Row], *, device: str, date: str, seconds: float, partial: str = "",
                    kept: list[str] = ()) -> str:
    """The gpu-check section: this run's ``rows`` (measured ``date`` on ``device``), then ``kept``, the table lines
    of rows an earlier run measured and this one did not run (:func:`earlier_rows`), each with its own date."""
    lines = [MARK_BEGIN, f"### `make gpu-check`: last run on {device}, {date} ({seconds / 60:.1f} min{partial})", "",
             "Rows this run did not measure keep the run that did (`measured`).", "",
             "| row | measured | baseline | status | figures |", "|---|---|---|---|---|"]
    for row in rows:
        figures = "; ".join(f"{k}: {v}" for k, v in row.figures.items()) or "-"
        lines.append(f"| {row.name} | {date}, {device} | {row.baseline} | {row.status} | {figures} |")
    return "\n".join([*lines, *kept, MARK_END]) + "\n"


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split(" | ")]


def earlier_rows(path: Path, *, rerun: list[str]) -> list[str]:
    """The table lines of the report's gpu-check section for rows not in ``rerun``, in ``ROWS`` order, as
    ``report_markdown`` writes them: a section from before the ``measured`` column gets its heading's date and
    device there."""
    text = path.read_text() if path.exists() else ""
    if MARK_BEGIN not in text or MARK_END not in text:
        return []
    section = text.split(MARK_BEGIN, 1)[1].split(MARK_END, 1)[0]
    heading = next((line for line in section.splitlines() if line.startswith("### ")), "")
    old_stamp = heading.split(" on ", 1)[1].rsplit(" (", 1)[0] if " on " in heading else "earlier"
    if ", " in old_stamp:  # "H200, 2026-11-24" -> "2026-11-24, H200"
        device, date = old_stamp.rsplit(", ", 1)
        old_stamp = f"{date}, {device}"
    found: dict[str, str] = {}
    for line in section.splitlines():
        cells = _cells(line)
        if not line.startswith("| ") or cells[0] in ("row", "---") or set(cells[0]) <= set("-|"):
            continue
        if len(cells) == 4:  # | row | baseline | status | figures |
            cells.insert(1, old_stamp)
        if cells[0] in ROWS and cells[0] not in rerun:
            found[cells[0]] = "| " + " | ".join(cells) + " |"
    return [found[name] for name in ROWS if name in found]


def write_report(markdown: str, path: Path) -> None:
    """Replace the gpu-check section of ``path`` (between its markers), or append one."""
    replace_section(path, markdown, begin=MARK_BEGIN, end=MARK_END)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--report", type=Path, default=None,
                        help="where the table goes (default BENCHMARKS.md; with --dry-run a temporary file)")
    parser.add_argument("--dry-run", action="store_true",
                        help="check every row's GPU sizes, then run every row on the CPU at toy sizes (DRY_SIZES)")
    args = parser.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = sorted(set(args.rows) - set(ROWS))
    if unknown:
        parser.error(f"unknown rows {unknown}: use {', '.join(ROWS)}")
    return args


def run_rows(names: list[str], *, builders: dict[str, Callable[[], Row]], report: Path,
             device_name: str) -> list[Row]:
    """Build each row of ``names`` in turn (a row that raises is a failed row; the others still run) and rewrite
    the report after every one, so a run stopped part way (a session's command limit) keeps its finished rows."""
    started, rows = time.perf_counter(), []
    kept = earlier_rows(report, rerun=names)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    for name in names:
        row_started = time.perf_counter()
        try:
            row = builders[name]()
        except Exception as exc:  # noqa: BLE001 - one failed row is reported, the others still run
            traceback.print_exc()  # the table keeps one line; the terminal gets where it failed
            row = Row(name=name, baseline="", status="failed", figures={"error": f"{type(exc).__name__}: {exc}"})
        # the row's own wall time on the terminal: what sizes the next GPU session's commands
        print(f"{row.name}: {row.status} ({time.perf_counter() - row_started:.0f} s): "
              + "; ".join(f"{k}: {v}" for k, v in row.figures.items()), flush=True)
        rows.append(row)
        partial = "" if len(rows) == len(names) else f", {len(rows)} of {len(names)} rows so far"
        write_report(report_markdown(rows, device=device_name, date=date, seconds=time.perf_counter() - started,
                                     partial=partial, kept=kept), report)
    return rows


# ---------------------------------------------------------------------------------------------------- sizes
ROW_FUNCTIONS: dict[str, Callable[..., Row]] = {
    "pipeline": pipeline_row, "simclr": simclr_row, "kmeans": kmeans_row, "host_syncs": host_syncs_row,
    "ddp": ddp_row, "clip": clip_row, "export": export_row, "checkpoint": checkpoint_row, "input": input_row,
    "table4": table4_row}

#: Every row at toy sizes on the CPU (``--dry-run``): the same functions as on a GPU, the model and data shrunk.
DRY_SIZES: dict[str, dict] = {
    "pipeline": dict(overrides=("device=cpu",)),
    "simclr": dict(arch="resnet18", batch=2, steps=1, image_size=32, compiles=(False,)),
    "kmeans": dict(num=2_000, dim=8, ks=(20, 4), compared=1_000, on_gpu=False),
    "host_syncs": dict(steps=4),
    "ddp": dict(device="cpu"),
    "clip": dict(model="mclpipe-tiny-vit", trainable_blocks=1, image_size=32, steps=2, batch=4, samples_per_shard=4,
                 rounds=1, decoders=(1, 2), warmup_steps=1, device="cpu", precision="bf16",
                 large_model="mclpipe-tiny-vit", large_batch=4, large_steps=4, large_image_size=32),
    "export": dict(num=10, batch=4, arch="resnet18", size=32),
    "checkpoint": dict(arch="resnet18"),
    "input": dict(workers=(0, 1), batch=8, steps=2, image_size=32, arch="small_cnn", precision="fp32", epochs=2,
                  log_every_steps=1, resample_workers=(1,)),
    # the Table 4 quick preset itself (ResNet-18, CIFAR stem, K = 5, with control) at a few steps and 2 of its 3
    # stages (a third repeats the second's code); fp32, as bf16 autocast on a CPU without bf16 instructions is
    # emulated (2 steps of ResNet-18: ~1 min instead of seconds)
    "table4": dict(overrides=("device=cpu", "train.precision=fp32", "mcl.num_stages=2",
                              "data.trifeature_paper.per_combination=1",
                              "data.trifeature_paper.test_per_combination=1", "data.trifeature_paper.image_size=16",
                              "train.epochs=1", "train.max_steps_per_epoch=2", "train.batch_size=32",
                              "eval.probe_max_iter=10", "eval.probe_max_train=200")),
}


class SizeError(ValueError):
    """A row's sizes cannot give the figures it reports: found before it runs (the dry run checks the GPU run's)."""


def _check_clip(*, steps: int, batch: int, samples_per_shard: int, decoders: tuple[int, ...], **_) -> None:
    # open_clip_train's get_wds_dataset asserts a shard per worker ("number of shards must be >= total workers"),
    # and each worker stops at its shards' end: every worker needs the same whole batches, or open_clip trains
    # fewer steps than ours (the 2026-11-26 H200 run lost its clip row to 10 shards for 12 workers).
    samples = steps * batch
    if samples % samples_per_shard or samples_per_shard % batch:
        raise SizeError(f"clip: steps x batch ({steps} x {batch}) must fill whole shards of samples_per_shard "
                        f"({samples_per_shard}), each of whole batches")
    shards = samples // samples_per_shard
    wrong = [count for count in decoders if shards < count or shards % count]
    if wrong:
        counts = " and ".join(str(count) for count in wrong)
        raise SizeError(f"clip: {shards} shards for {counts} open_clip workers: open_clip_train needs at least a "
                        f"shard a worker and the same number for each; make steps x batch / samples_per_shard a "
                        f"multiple of {counts}")


def _check_pipeline(*, preset: str, overrides: tuple[str, ...], **_) -> None:
    from pipeline_config.loader import load_config
    try:
        load_config(preset, list(overrides))
    except Exception as exc:  # noqa: BLE001 - ConfigError or a pydantic error: either is this row's mistake
        raise SizeError(f"{preset} with {list(overrides)} does not load: {exc}") from None


def _check_input(*, steps: int, log_every_steps: int, workers: tuple[int, ...], **_) -> None:
    # the steady figures are the windows after each epoch's first: an epoch needs two or more windows
    if steps // log_every_steps < 2:
        raise SizeError(f"input: {steps} steps an epoch in windows of {log_every_steps} leave no steady window")


def _check_at_least(**values) -> None:
    for key, (value, least) in values.items():
        if value < least:
            raise SizeError(f"{key} {value} < {least}")


SIZE_CHECKS: dict[str, Callable[..., None]] = {
    "clip": _check_clip, "pipeline": _check_pipeline, "table4": _check_pipeline, "input": _check_input,
    "export": lambda *, num, batch, **_: _check_at_least(**{"export: images": (num, 2 * batch)}),
    "simclr": lambda *, batch, steps, **_: _check_at_least(**{"simclr: batch": (batch, 2), "simclr: steps": (steps, 1)}),
    "kmeans": lambda *, num, ks, compared, **_: _check_at_least(**{"kmeans: points": (num, compared),
                                                                  "kmeans: compared points": (compared, max(ks) + 1)}),
}


def check_sizes(row: str, **sizes) -> None:
    """Raise :class:`SizeError` when ``row``'s ``sizes`` cannot work; every row calls it with its own sizes before
    it runs, and the dry run with the GPU run's (:func:`gpu_sizes`)."""
    if row in SIZE_CHECKS:
        SIZE_CHECKS[row](**sizes)


def gpu_sizes(row: str) -> dict:
    """The sizes ``make gpu-check`` runs ``row`` at: its function's defaults."""
    return {name: p.default for name, p in inspect.signature(ROW_FUNCTIONS[row]).parameters.items()
            if p.default is not inspect.Parameter.empty}


def row_builders(*, device: torch.device, work: Path, sizes: dict[str, dict]) -> dict[str, Callable[[], Row]]:
    """Each row's call: its ``sizes`` (none: the GPU sizes), ``device`` where it takes a torch device without a
    default, and a work directory of its own under ``work``."""
    def build(name: str) -> Row:
        function = ROW_FUNCTIONS[name]
        parameters = inspect.signature(function).parameters
        kwargs = dict(sizes.get(name, {}))
        if "device" in parameters and parameters["device"].default is inspect.Parameter.empty:
            kwargs["device"] = device
        if "work" in parameters:
            kwargs["work"] = work / name
            kwargs["work"].mkdir(parents=True, exist_ok=True)
        return function(**kwargs)
    return {name: functools.partial(build, name) for name in ROW_FUNCTIONS}


def dry_run(names: list[str], *, report: Path | None) -> int:
    """``--dry-run``: check the GPU run's sizes of every row in ``names``, then run each row on the CPU at
    DRY_SIZES through the same functions, the report writer included (into ``report``, else a temporary file).
    Exit 1 when a GPU size is wrong or a row does not come out ``ok``."""
    problems = []
    for name in names:
        try:
            check_sizes(name, **gpu_sizes(name))
        except SizeError as exc:
            problems.append(f"{name}: the GPU run's sizes: {exc}")
    with tempfile.TemporaryDirectory(prefix="gpu-check-dry-") as tmp:
        work = Path(tmp)
        rows = run_rows(names, builders=row_builders(device=torch.device("cpu"), work=work, sizes=DRY_SIZES),
                        report=report or work / "BENCHMARKS.md", device_name="CPU (dry run, toy sizes)")
    problems += [f"{row.name}: {row.status} in the dry run: {row.figures.get('error', '')}" for row in rows
                 if row.status != "ok"]
    for problem in problems:
        print(f"make gpu-check --dry-run: {problem}", flush=True)
    if not problems:
        print(f"make gpu-check --dry-run: {len(rows)} rows ran on the CPU and the GPU sizes check out", flush=True)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args.rows, report=args.report)
    report = args.report or Path("BENCHMARKS.md")
    if not torch.cuda.is_available():
        from contrastive.engine.device import check_gpus_usable
        from contrastive.errors import ConfigError
        try:  # a GPU that nvidia-smi lists but this torch cannot use is a failure to fix, not "no GPU"
            check_gpus_usable("cuda")
        except ConfigError as exc:
            print(f"make gpu-check: {exc}")
            return 2
        for name in args.rows:
            print(f"{name}: not measured: no CUDA device")
        return 0
    device = torch.device("cuda", 0)
    with tempfile.TemporaryDirectory() as tmp:
        rows = run_rows(args.rows, builders=row_builders(device=device, work=Path(tmp), sizes={}), report=report,
                        device_name=torch.cuda.get_device_name(device))
    return 1 if any(row.status == "failed" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
