"""What the framework costs per step, measured without a GPU (issue 43, outcome 1): a near-zero-cost model, so each
step is bound by the input and the framework's own work, run through our code and through the loop a user would
otherwise pick, side by side in one process, interleaved (A B, B A, ...), medians compared. Ratios are ours / theirs.

1. CLIP: our CLIP stage against ``open_clip_train``'s ``train_one_epoch`` with its own ``get_wds_dataset`` on the
   same shards, batch and steps (``bench.engine_throughput.clip_runs``, the runner of the CLIP rows), with 1 and 2
   decode workers a side (our worker processes; open_clip's DataLoader workers). The model is an open_clip config
   registered here (``ZERO_CLIP``: a 1-layer ViT of width 8 with one 32 px patch, a 1-layer text tower of width 8,
   context 8, embedding 8): its forward is a handful of tiny matmuls.
2. Export: our export loop (``bench.gpu_check.export_through_engine``: ``compute_embeddings`` and the float16 shard
   writer, the `export` GPU row's adapter) against a bare loop of the same model over the same uint8 images: the
   whole call and the loop's steady rate (first to last batch written). The model (:class:`ZeroCostEncoder`) is a
   channel mean and one (3 x 8) matmul.
3. Unimodal training from JPEG files: our image stage (``prepare_image_folder(storage="files")`` +
   ``train_stage``) against torchvision ``ImageFolder`` + ``transforms.v2`` + ``DataLoader`` with channels_last and
   ``pin_memory`` (which only acts on a GPU), the same DataLoader workers, at 1 and 2 torch threads
   (``bench.engine_throughput.files_comparison``, the runner of the engine rows), with ``ZERO_MODEL``: SimCLR on a
   one-layer CNN of 4 channels (conv 3x3, batch norm, ReLU, mean) and a 4-8-8 head.

Goals (issue 43): CLIP >= 1.0x open_clip_train's samples/s at 1 and 2 workers; export >= 0.9x the bare loop, whole
call and steady; unimodal >= 1.0x at 1 thread and > 1.0x at 2.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch

from bench.common import Result, log, median, module_main, threads_note

#: The CLIP side's model: an open_clip config whose forward costs next to nothing.
ZERO_CLIP_NAME = "bench-zero-clip"
ZERO_CLIP = {"embed_dim": 8,
             "vision_cfg": {"image_size": 32, "layers": 1, "width": 8, "head_width": 8, "patch_size": 32},
             "text_cfg": {"context_length": 8, "vocab_size": 49408, "width": 8, "heads": 1, "layers": 1}}
#: The unimodal side's model (the config's model section).
ZERO_MODEL = {"encoder": "small_cnn", "widths": [4], "projection_hidden": 8, "projection_dim": 8}
CLIP_WORKERS = (1, 2)
THREAD_SETTINGS = (1, 2)


class ZeroCostEncoder(torch.nn.Module):
    """(B, 3, H, W) float -> (B, 8): the mean of each channel times a fixed (3, 8) matrix."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 8, generator=torch.Generator().manual_seed(0)))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images.mean(dim=(2, 3)) @ self.weight


def _ratio_result(*, name: str, workload: str, baseline: str, ours: list[float], theirs: list[float], goal: str,
                  least: float, strictly: bool = False, notes: list[str] = (), unit: str = "samples/s") -> Result:
    """A row from per-run rates (``ours``, ``theirs``): the ratio of the medians, PASS at ``>= least`` (``>`` when
    ``strictly``)."""
    ratio = median(ours) / median(theirs)
    runs = lambda rates: ", ".join(f"{rate:,.0f}" for rate in rates)  # noqa: E731
    return Result(name=name, workload=workload, baseline=baseline, ratio=ratio,
                  ratio_note=f"{unit} ratio ours / theirs, median of {len(ours)} interleaved runs each", goal=goal,
                  passed=ratio > least if strictly else ratio >= least,
                  notes=[f"{unit}: ours {median(ours):,.0f} (runs {runs(ours)}), theirs {median(theirs):,.0f} "
                         f"(runs {runs(theirs)})", *notes])


# ---------------------------------------------------------------------------------------------------- 1. CLIP
def register_zero_clip(directory: Path) -> str:
    """Register ``ZERO_CLIP`` with open_clip (a JSON config file under ``directory``); returns its name."""
    import open_clip
    path = directory / f"{ZERO_CLIP_NAME}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ZERO_CLIP))
    open_clip.add_model_config(path)
    return ZERO_CLIP_NAME


def clip_rows(*, work: Path, samples: int, batch: int, samples_per_shard: int, workers: tuple[int, ...] = CLIP_WORKERS,
              rounds: int, warmup_steps: int = 2) -> list[Result]:
    """Row 1 at each worker count of ``workers`` (shards checked as the GPU row checks them)."""
    from bench.engine_throughput import clip_runs
    from bench.gpu_check import check_sizes
    from contrastive.modalities.image_text.data import write_tiny_shards
    from contrastive.modalities.image_text.model import ClipSpec
    steps = samples // batch
    check_sizes("clip", steps=steps, batch=batch, samples_per_shard=samples_per_shard, decoders=workers)
    name = register_zero_clip(work / "model-config")
    urls = write_tiny_shards(directory=work / "shards", num_samples=samples, samples_per_shard=samples_per_shard,
                             image_size=64, corrupt=False)["urls"]
    torch.set_num_threads(1)
    results = []
    for count in workers:
        runs = clip_runs(work=work / f"w{count}", clip_spec=ClipSpec(model_name=name, trainable_image_blocks=1),
                         urls=urls, device="cpu", precision="fp32", batch=batch, steps=steps, rounds=rounds,
                         warmup_steps=warmup_steps, threads=1, workers=count)
        trained = {*(r["steps"] for r in runs["ours"]), *(r["batches"] for r in runs["open_clip"])}
        if trained != {steps}:
            raise RuntimeError(f"the sides trained {sorted(trained)} batches, not {steps}")
        ours = [r["samples_per_second"] for r in runs["ours"]]
        theirs = [r["samples_per_second"] for r in runs["open_clip"]]
        log(f"framework: CLIP {count} worker(s): ours {median(ours):.0f}, open_clip {median(theirs):.0f} samples/s")
        results.append(_ratio_result(
            name=f"Framework cost: CLIP stage vs open_clip_train, zero-cost model, {count} worker(s)",
            workload=(f"{name} (1-layer ViT width 8, one 32 px patch; text 1 layer width 8, locked), {samples:,} "
                      f"samples of 64 px JPEG in {len(urls)} shards, batch {batch}, 1 epoch ({steps} steps), fp32, "
                      f"CPU, 1 torch thread, {count} decode worker(s) a side"),
            baseline="open_clip_train.train.train_one_epoch + get_wds_dataset (its DataLoader workers), same shards, "
                     "model, init, transform, tokenizer, AdamW, batch and steps",
            ours=ours, theirs=theirs, goal=">= 1.0x (samples/s)", least=1.0,
            notes=["ours timed without its end-of-epoch checkpoint (train_one_epoch writes none); with it: "
                   + ", ".join(f"{r['samples_per_second_with_checkpoint']:,.0f}" for r in runs["ours"]),
                   "time to the first batch (worker start, shuffle buffer): ours "
                   f"{median([r['first_batch_s'] for r in runs['ours']]):.2f} s, open_clip "
                   f"{median([r['first_batch_s'] for r in runs['open_clip']]):.2f} s"]))
    return results


# ---------------------------------------------------------------------------------------------------- 2. export
def bare_export_seconds(*, model: torch.nn.Module, images: torch.Tensor, batch: int) -> float:
    """The baseline: the same model over the same images in batches (uint8 -> float / 255, channels_last as our
    adapter feeds it), inference mode, outputs dropped: seconds."""
    import time
    started = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, len(images), batch):
            model(images[start:start + batch].float().div_(255).contiguous(memory_format=torch.channels_last))
    return time.perf_counter() - started


def export_row(*, work: Path, num: int, batch: int, size: int, rounds: int) -> Result:
    """Row 2: whole call and steady rate of our export against the bare loop, ``rounds`` interleaved runs."""
    from bench.gpu_check import export_through_engine
    model = ZeroCostEncoder().eval()
    images = torch.randint(0, 256, (num, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    cpu = torch.device("cpu")
    whole, steady, bare = [], [], []
    export_through_engine(model=model, images=images[:2 * batch], batch=batch, device=cpu, precision="fp32",
                          out_dir=work / "warmup")
    bare_export_seconds(model=model, images=images[:2 * batch], batch=batch)
    for round_number in range(rounds):
        for side in (("ours", "bare") if round_number % 2 == 0 else ("bare", "ours")):
            if side == "ours":
                run = export_through_engine(model=model, images=images, batch=batch, device=cpu, precision="fp32",
                                            out_dir=work / f"export-{round_number}")
                whole.append(run.rows / run.seconds)
                steady.append(run.steady)
                shutil.rmtree(work / f"export-{round_number}")
            else:
                bare.append(num / bare_export_seconds(model=model, images=images, batch=batch))
    log(f"framework: export whole {median(whole):.0f}, steady {median(steady):.0f}, bare {median(bare):.0f} img/s")
    result = _ratio_result(
        name="Framework cost: embedding export vs a bare loop, zero-cost model",
        workload=(f"{num:,} uint8 images 3x{size}x{size} in host memory, batch {batch}, fp32, CPU, "
                  f"{torch.get_num_threads()} torch threads; model: channel mean x a (3, 8) matrix"),
        baseline="bare loop: the same model over the same batches (uint8 -> float / 255, channels_last), inference "
                 "mode, outputs dropped",
        ours=whole, theirs=bare, goal=">= 0.9x (images/s, whole call and steady)",
        least=0.9, unit="images/s (whole call)",
        notes=[f"steady rate (first to last batch written): ours {median(steady):,.0f} images/s = "
               f"{median(steady) / median(bare):.2f}x the bare loop (runs "
               + ", ".join(f"{rate:,.0f}" for rate in steady) + ")",
               "ours: compute_embeddings (inference mode, one read a batch, the next batch queued first) and the "
               "float16 shard writer (ids, manifest) as bench.gpu_check's export row calls them"])
    result.passed = bool(result.passed and median(steady) / median(bare) >= 0.9)
    return result


# ---------------------------------------------------------------------------------------------------- 3. unimodal
def unimodal_rows(*, work: Path, num_images: int, rounds: int, threads: tuple[int, ...] = THREAD_SETTINGS,
                  workers: int = 1) -> list[Result]:
    """Row 3 at each torch thread count (the image folder written and indexed once)."""
    from bench.engine_throughput import BATCH, files_comparison, write_image_folder
    from contrastive.modalities.image.datasets.image_folder import prepare_image_folder
    folder = write_image_folder(work / "images", num_images=num_images)
    files_dir = prepare_image_folder(source=folder, root=work / "data", image_size=32, storage="files",
                                     test_fraction=0.0)
    steps = num_images // BATCH
    results = []
    for count in threads:
        runs = files_comparison(folder=folder, files_dir=files_dir, stage_dirs=work / f"stages-t{count}",
                                threads=count, steps=steps, model=ZERO_MODEL, workers=workers, rounds=rounds)
        ours = [r["samples_per_second"] for r in runs["ours"]]
        theirs = [r["samples_per_second"] for r in runs["baseline"]]
        log(f"framework: unimodal {count} thread(s): ours {median(ours):.0f}, theirs {median(theirs):.0f} images/s")
        results.append(_ratio_result(
            name=f"Framework cost: unimodal training from JPEG files, zero-cost model, {count} torch thread(s)",
            workload=(f"{num_images:,} JPEGs 64x64 -> 32 px, SimCLR on a 1-layer CNN of 4 channels + 4-8-8 head, "
                      f"batch {BATCH}, crop-only, 1 epoch ({steps} steps), fp32, CPU, {count} torch thread(s), "
                      f"{workers} DataLoader worker(s) a side"),
            baseline="torchvision ImageFolder + per-sample transforms.v2 (Resize, RandomResizedCrop x2, ToImage, "
                     f"ToDtype) + DataLoader({BATCH}, {workers} worker(s), shuffle, pin_memory where a GPU is) + the "
                     "same model/loss in channels_last, Adam",
            ours=ours, theirs=theirs, goal=">= 1.0x (images/s)" if count == 1 else "> 1.0x (images/s)", least=1.0,
            strictly=count > 1, unit="images/s",
            notes=["after the first batch: ours "
                   f"{median([r['steady_samples_per_second'] for r in runs['ours']]):,.0f}, theirs "
                   f"{median([r['steady_samples_per_second'] for r in runs['baseline']]):,.0f} images/s; first "
                   f"batch after: ours {median([r['first_batch_s'] for r in runs['ours']]):.2f} s, theirs "
                   f"{median([r['first_batch_s'] for r in runs['baseline']]):.2f} s"]))
    return results


# ---------------------------------------------------------------------------------------------------- entry
def run(*, quick: bool) -> list[Result]:
    work = Path(tempfile.mkdtemp(prefix="bench-framework-"))
    note = threads_note()
    try:
        results = clip_rows(work=work / "clip", samples=1_024 if quick else 2_048, batch=64, samples_per_shard=128,
                            rounds=3)
        results.append(export_row(work=work / "export", num=4_096 if quick else 8_192, batch=256, size=64, rounds=3))
        results += unimodal_rows(work=work / "unimodal", num_images=1_024 if quick else 2_048, rounds=3)
        for result in results:
            result.notes.append(f"machine: {note} of this module (shared with other jobs: ratios, not seconds)")
        return results
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    module_main(run)
