"""The CPU of the CLIP reading process a sample, against open_clip_train's main process (issue 52).

What a training process pays to be fed: the process (on a GPU, the reading thread beside the training thread, the
two sharing the GIL) that turns shard samples, decoded by worker processes, into batches ready for the step. Both
sides read the same ``SAMPLES`` img2dataset-style samples (256 px JPEG + caption + json, ``write_tiny_shards``) in
shards of ``PER_SHARD``, to batches of ``BATCH`` ready for a ViT-B-32 step: open_clip's own train transform
(``image_transform(224, is_train=True)``) and tokenizer on both sides, with 1, 4, 8 and 12 decode workers (the
workers oversubscribe the cores here; what is compared is the reading process's own CPU, which is what the
training thread competes with).

- ours: ``stream_batches(uint8=True, pool=...)`` + ``ready_for_step`` as a GPU stage's reading thread runs them
  (``bench.image_input.ClipOurs``: one decode pool kept across epochs, its worker that reads the shards' tar
  headers, captions tokenised in the workers, the step normalises on the device; pinned on CUDA).
- baseline: ``open_clip_train.data.get_wds_dataset(workers=W, batch, tokenizer)`` iterated as ``train_one_epoch``
  does (``bench.image_input.ClipBaseline``): DataLoader workers persistent (open_clip's setting), pinned on CUDA
  (the setting a user who copies asynchronously adds), ``prefetch_factor`` 2 (the default; ours keeps 2 tasks a
  worker in flight too), each worker reading its own shards.

Per count: a warm-up epoch a side (workers start, the page cache fills), then ``ROUNDS`` epochs a side,
interleaved; the medians of CPU seconds a sample of the reading process (``time.process_time``: all its threads)
are compared. Goal: ours <= open_clip's at every count (ratio = theirs / ours >= 1.0; the row's ratio is the
worst count's).
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from bench.common import Result, fmt_count, log, median, module_main, threads_note

NAME = "CLIP reading process: CPU a sample vs open_clip_train's main process"
SAMPLES = 1_536  # 12 batches an epoch: every count's open_clip workers read whole shards (12 of them)
PER_SHARD = 128
BATCH = 128  # the `clip` row's batch (bench/gpu_check.py); --quick: half the samples, shards and batches
WORKERS = (1, 4, 8, 12)
ROUNDS = 3


def _epoch(side) -> dict:
    """One epoch of ``side``: samples, wall seconds, CPU seconds of this (the reading) process and of its
    workers."""
    from bench.image_input import _cpu_seconds

    pids = side.worker_pids()
    cpu0, workers0, start = time.process_time(), _cpu_seconds(pids), time.perf_counter()
    samples = side.epoch()
    seconds = time.perf_counter() - start
    reading = time.process_time() - cpu0
    pids = pids or side.worker_pids()
    return {"samples": samples, "seconds": seconds, "reading_cpu": reading,
            "workers_cpu": _cpu_seconds(pids) - workers0}


def measure(*, urls: list[str], workers: int, rounds: int, per_shard: int, batch: int) -> dict[str, list[dict]]:
    """Both sides at ``workers`` decode workers: {"ours": [epoch, ...], "open_clip": [...]} after a warm-up epoch
    each."""
    from open_clip import get_tokenizer, image_transform

    from bench.image_input import ClipBaseline, ClipOurs

    transform, tokenizer = image_transform(224, is_train=True), get_tokenizer("ViT-B-32")
    sides = {"ours": ClipOurs(urls=urls, transform=transform, tokenizer=tokenizer, workers=workers,
                              normalize_on_host=False, batch=batch),
             "open_clip": ClipBaseline(urls=urls, transform=transform, tokenizer=tokenizer, workers=workers,
                                       batch=batch, per_shard=per_shard)}
    try:
        for side in sides.values():
            _epoch(side)
        runs: dict[str, list[dict]] = {name: [] for name in sides}
        names = list(sides)
        for round_number in range(rounds):
            for name in names if round_number % 2 == 0 else names[::-1]:
                runs[name].append(_epoch(sides[name]))
    finally:
        for side in sides.values():
            side.close()
    return runs


def ms_a_sample(runs: list[dict], what: str = "reading_cpu") -> float:
    """Median over epochs of ``what`` (CPU seconds) a sample, in milliseconds."""
    return median([1e3 * r[what] / r["samples"] for r in runs])


def result(*, by_workers: dict[int, dict[str, list[dict]]], samples: int, per_shard: int, batch: int,
           note: str) -> Result:
    """The row: ratio = open_clip's reading-process CPU a sample / ours, at the worst worker count."""
    ratios = {w: ms_a_sample(runs["open_clip"]) / ms_a_sample(runs["ours"]) for w, runs in by_workers.items()}
    worst = min(ratios, key=ratios.get)
    notes = []
    for w, runs in by_workers.items():
        ours, theirs = runs["ours"], runs["open_clip"]
        notes.append(f"{w} worker(s): ours {ms_a_sample(ours):.3f} ms of the reading process's CPU a sample, "
                     f"open_clip {ms_a_sample(theirs):.3f} ms = **{ratios[w]:.2f}x**; workers' CPU a sample (ours: the "
                     f"decoders and the tar-header reader) ours "
                     f"{ms_a_sample(ours, 'workers_cpu'):.2f} ms, open_clip {ms_a_sample(theirs, 'workers_cpu'):.2f} "
                     f"ms; samples/s ours {median([r['samples'] / r['seconds'] for r in ours]):.0f}, open_clip "
                     f"{median([r['samples'] / r['seconds'] for r in theirs]):.0f} (the workers oversubscribe the "
                     "cores: context only)")
    notes.append(note)
    return Result(
        name=NAME,
        workload=(f"{fmt_count(samples)} samples (256 px JPEG + caption) in {samples // per_shard} shards of "
                  f"{per_shard} -> batches of {batch}: open_clip's ViT-B-32 train transform (224 px) and tokenizer on "
                  f"both sides, {', '.join(map(str, by_workers))} decode workers; medians of "
                  f"{len(next(iter(by_workers.values()))['ours'])} interleaved epochs a side after a warm-up epoch"),
        baseline=(f"open_clip_train.data.get_wds_dataset(workers=W, batch {batch}, tokenizer): its DataLoader's "
                  "main process, workers persistent, pinned on CUDA, tar reader swapped for webdataset 1.x as in "
                  "bench/shards.py"),
        baseline_s=ms_a_sample(by_workers[worst]["open_clip"]) / 1e3,
        ours_s=ms_a_sample(by_workers[worst]["ours"]) / 1e3,
        ratio=ratios[worst], ratio_note=f"reading-process CPU a sample, worst count: {worst} workers",
        goal="<= open_clip at 1, 4, 8, 12 workers (>= 1.0x each)",
        passed=all(r >= 1.0 for r in ratios.values()), notes=notes,
        details={"ratios": {str(w): r for w, r in ratios.items()},
                 "runs": {str(w): runs for w, runs in by_workers.items()}})


def run(*, quick: bool) -> list[Result]:
    import torch

    from contrastive.modalities.image_text.data import write_tiny_shards

    torch.set_num_threads(1)  # the reading process's own torch work (none on the CPU) on one thread
    samples, per_shard, batch = (SAMPLES // 2, PER_SHARD // 2, BATCH // 2) if quick else (SAMPLES, PER_SHARD, BATCH)
    rounds = 2 if quick else ROUNDS
    note = threads_note()
    work = Path(tempfile.mkdtemp(prefix="bench-clip-reader-"))
    try:
        shards = write_tiny_shards(directory=work / "shards", num_samples=samples, samples_per_shard=per_shard,
                                   image_size=256, corrupt=False)
        by_workers = {}
        for workers in WORKERS:
            begin = time.perf_counter()
            by_workers[workers] = measure(urls=shards["urls"], workers=workers, rounds=rounds, per_shard=per_shard,
                                          batch=batch)
            log(f"clip reader: {workers} worker(s) in {time.perf_counter() - begin:.0f} s: ours "
                f"{ms_a_sample(by_workers[workers]['ours']):.3f} ms, open_clip "
                f"{ms_a_sample(by_workers[workers]['open_clip']):.3f} ms a sample")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [result(by_workers=by_workers, samples=samples, per_shard=per_shard, batch=batch, note=note)]


if __name__ == "__main__":
    module_main(run)
