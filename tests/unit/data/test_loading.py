"""The batch reader (contrastive.data.loading): the same batches whatever the number of workers, workers kept
across reads (epochs), and the rule that picks the number of workers when the config leaves it unset."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from contrastive.data import loading
from contrastive.modalities.image.datasets.image_folder import prepare_image_folder
from contrastive.data.loading import BatchReader, default_workers, load_dataset, resolve_workers


@pytest.fixture(scope="module")
def files_dataset(tmp_path_factory):
    """12 small JPEGs (2 classes) indexed as storage "files", decoded at the reduced scale (the config's default)."""
    root = tmp_path_factory.mktemp("loading")
    rng = np.random.default_rng(0)
    for i in range(12):
        folder = root / "src" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (30 + i, 40, 3), dtype=np.uint8)).save(folder / f"{i}.jpg")
    return load_dataset(prepare_image_folder(source=root / "src", root=root / "c", image_size=12, storage="files",
                                             decode_scale="auto"))


def _plan(seed: int, n: int = 12) -> list[np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    return [order[:5], order[5:6], order[6:]]


def _read(reader: BatchReader, plan) -> list[tuple[np.ndarray, torch.Tensor]]:
    return list(reader.read(iter(plan)))


def test_the_same_batches_for_0_1_and_3_workers_and_every_epoch(files_dataset):
    """Two epochs (two plans) through one reader per worker count: equal rows and pixels, in the planned order; the
    workers of the second epoch are the first epoch's processes (persistent)."""
    epochs = [_plan(1), _plan(2)]
    runs = {}
    for workers in (0, 1, 3):
        with BatchReader(files_dataset, workers=workers, prefetch=1) as reader:
            first = _read(reader, epochs[0])
            pids = [w.pid for w in reader._workers.worker_processes()] if workers else []
            runs[workers] = [first, _read(reader, epochs[1])]
            if workers:
                assert [w.pid for w in reader._workers.worker_processes()] == pids and len(pids) == workers
                assert all(w.is_alive() for w in reader._workers.worker_processes())
    for epoch, plan in enumerate(epochs):
        for (rows0, images0), (rows1, images1), (rows3, images3), planned in zip(
                runs[0][epoch], runs[1][epoch], runs[3][epoch], plan):
            assert np.array_equal(rows0, planned) and np.array_equal(rows1, planned) and np.array_equal(rows3, planned)
            assert torch.equal(images0, images1) and torch.equal(images0, images3)
            assert torch.equal(images0, files_dataset.get_batch(planned))


def test_a_read_left_early_does_not_leak_into_the_next(files_dataset):
    """An epoch cut short (a resume, stop_after_steps) leaves batches in flight; the next read gets only its own."""
    with BatchReader(files_dataset, workers=2, prefetch=2) as reader:
        partial = reader.read(iter(_plan(3)))
        next(partial)
        partial.close()
        again = _read(reader, _plan(4))
    assert [r.tolist() for r, _ in again] == [p.tolist() for p in _plan(4)]


def test_close_ends_the_workers(files_dataset):
    reader = BatchReader(files_dataset, workers=1)
    _read(reader, _plan(5))
    workers = reader._workers.worker_processes()
    assert len(workers) == 1
    reader.close()
    for worker in workers:
        worker.join(timeout=10)
    assert not any(w.is_alive() for w in workers)


def test_default_workers_rule(monkeypatch):
    assert default_workers(cores=2, processes=1) == 1  # this machine: one core decodes, one trains
    assert default_workers(cores=16, processes=1) == 15
    assert default_workers(cores=64, processes=8) == 7  # a node of 8 GPUs: the cores shared by the ranks
    assert default_workers(cores=128, processes=1) == loading.MAX_DEFAULT_WORKERS
    assert default_workers(cores=1, processes=1) == 1 and default_workers(cores=4, processes=8) == 1
    monkeypatch.setattr(loading.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert default_workers() == 2  # 6 cores of affinity, 2 processes on the node: 3 each, one trains
    assert resolve_workers(None) == 2 and resolve_workers(0) == 0 and resolve_workers(5) == 5


def test_the_config_leaves_workers_to_the_rule():
    from pipeline_config.loader import load_config
    config = load_config("trifeature_tiny")
    assert config.train.workers is None
    assert load_config("trifeature_tiny", ["train.workers=3"]).train.workers == 3
