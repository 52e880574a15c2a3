"""Embedding export throughput: ``contrastive.stages.export_stage_embeddings`` (load dataset + model, embed every
sample in batches of 512 as the export task does, write float16 shards + ids + manifest) against a bare forward
loop over the same data (dataset and model already in memory, ``get_batch`` -> /255 -> ``model.embed``, results
discarded).

Goal (issue 6): throughput ratio (bare seconds / export seconds) >= 0.95. The model is the default preset's CNN
(widths 32/64/128/256) with random weights; images are 32 px noise (the encoder's cost does not depend on them).
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench import fixtures
from bench.common import (Result, RssPeak, fmt_bytes, fmt_count, fmt_seconds, interleaved, log, loglog_slope, median,
                          module_main)
from contrastive.data.dataset import ImageArrayDataset
from contrastive.stages import export_stage_embeddings, load_trained_model

BATCH = 512  # what tasks.mcl_tasks.export_embeddings passes


def bare_loop(*, dataset: ImageArrayDataset, model) -> None:
    with torch.no_grad():
        for start in range(0, len(dataset), BATCH):
            indices = np.arange(start, min(start + BATCH, len(dataset)), dtype=np.int64)
            model.embed(dataset.get_batch(indices).float().div_(255.0))


def run(*, quick: bool) -> list[Result]:
    sizes = [250, 500, 1_000] if quick else [500, 1_000, 2_000]
    repeats = 3
    root = Path(tempfile.mkdtemp(prefix="bench-export-"))
    try:
        model_path = fixtures.saved_model(root / "model.pt")
        device = torch.device("cpu")
        ours_t: dict[int, float] = {}
        bare_t: dict[int, float] = {}
        rss: dict[str, int | None] = {}
        for size in sizes:
            data_dir = fixtures.synthetic_dataset(root=root / "data", num_train=size * 3 // 4, num_test=size // 4)
            dataset = ImageArrayDataset.load(data_dir)
            model = load_trained_model(model_path=model_path, device=device)
            counter = iter(range(10_000))

            def export():
                out = root / "out" / str(next(counter))
                result = export_stage_embeddings(dataset_dir=data_dir, model_path=model_path, out_dir=out,
                                                 batch_size=BATCH, device="cpu")
                shutil.rmtree(out)
                return result

            bare_loop(dataset=dataset, model=model)  # warm-up: oneDNN kernels, page cache of the images
            times = interleaved({"bare": lambda: bare_loop(dataset=dataset, model=model), "export": export},
                                repeats=repeats)
            bare_t[size], ours_t[size] = median(times["bare"]), median(times["export"])
            log(f"export N={fmt_count(size)}: bare {fmt_seconds(bare_t[size])}, export {fmt_seconds(ours_t[size])}")
        largest = sizes[-1]
        with RssPeak() as peak:
            export()
        rss["export"] = peak.delta
        with RssPeak() as peak:
            bare_loop(dataset=dataset, model=model)
        rss["bare"] = peak.delta
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = bare_t[largest] / ours_t[largest]
    dim = 256
    return [Result(
        name="Embedding export throughput",
        workload=f"N={fmt_count(largest)} images 32 px, default CNN (D={dim}), batch {BATCH}, CPU "
                 f"({torch.get_num_threads()} torch threads)",
        baseline="bare forward loop over the same dataset (model and data already loaded)",
        baseline_s=bare_t[largest], ours_s=ours_t[largest], ratio=ratio, goal=">= 0.95 (throughput ratio)",
        passed=ratio >= 0.95,
        memory=f"export {fmt_bytes(rss['export'])} RSS delta, bare loop {fmt_bytes(rss['bare'])} RSS delta",
        growth=(f"export {loglog_slope(sizes, [ours_t[s] for s in sizes]):.2f}, bare "
                f"{loglog_slope(sizes, [bare_t[s] for s in sizes]):.2f}"),
        notes=[f"throughput: export {largest / ours_t[largest]:.0f} images/s, bare {largest / bare_t[largest]:.0f} "
               "images/s; the export also loads the dataset and model and writes float16 shards",
               "ratio by size: " + ", ".join(f"{fmt_count(s)} {bare_t[s] / ours_t[s]:.3f}" for s in sizes)],
        details={"export": ours_t, "bare": bare_t, "rss": rss},
    )]


if __name__ == "__main__":
    module_main(run)
