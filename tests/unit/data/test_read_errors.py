"""Read errors are read errors: an I/O error reading a prepared index or an image file is tried once more, then ends
the read as DataReadError naming the file; it is never counted among the broken samples (a moved data directory
once read as "20 of 20 samples are broken ({'unreadable_image': 20})"). A prepared index reopened by path (a
DataLoader worker, a retry) must be the file that was opened."""
from __future__ import annotations

import errno
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from contrastive.data import dataset as dataset_module
from contrastive.data.dataset import STRING_DTYPE, StoredColumn, save_index
from contrastive.data.loading import iter_batches, load_dataset
from contrastive.errors import DataError, DataReadError
from tests.unit.data.test_image_files import _class_folder, _prepare


@pytest.fixture
def files_dataset(tmp_path):
    """A prepared file-backed image folder (9 images) and its directory."""
    directory = _prepare(_class_folder(tmp_path / "src"), tmp_path / "c", "files")
    return load_dataset(directory), Path(directory)


def flaky(monkeypatch, target, name: str, *, failures: int, path_part: str):
    """``target.name`` raising EIO for its first ``failures`` calls on a path holding ``path_part`` (an fd's path
    for os.pread), then doing what it does: a failing disk or a network filesystem's hiccup."""
    real = getattr(target, name)
    calls = {"failed": 0}

    def call(*args, **kwargs):
        where = os.readlink(f"/proc/self/fd/{args[0]}") if name == "pread" else str(args[0])
        if path_part in where and calls["failed"] < failures:
            calls["failed"] += 1
            raise OSError(errno.EIO, "Input/output error", where)
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, call)
    return calls


def test_a_worker_reading_a_moved_data_directory_gets_a_read_error_naming_the_index_not_broken_images(files_dataset):
    dataset, directory = files_dataset
    worker_copy = pickle.loads(pickle.dumps(dataset))  # what a DataLoader worker opens again, by path
    directory.rename(directory.with_name("moved"))
    with pytest.raises(DataReadError, match=rf"the prepared index {directory / 'index.npz'} \(tried twice\)"):
        worker_copy.get_batch(np.arange(len(worker_copy)))
    assert worker_copy.skips.skipped == {}  # nothing counted as broken


def test_the_batch_reader_ends_with_the_read_error_of_its_worker_as_one_line(files_dataset):
    dataset, directory = files_dataset
    reader = iter_batches(dataset, [np.arange(4), np.arange(4, 8)], workers=1)
    directory.rename(directory.with_name("moved"))  # the worker process opens the index after this
    with pytest.raises(DataReadError) as raised:
        list(reader)
    assert str(raised.value).startswith("could not read the prepared index") and "\n" not in str(raised.value)


def test_an_image_file_that_cannot_be_read_ends_the_read_naming_it(files_dataset, monkeypatch):
    dataset, _ = files_dataset
    rows = {sample_id: row for row, sample_id in enumerate(dataset.ids)}
    target = dataset.file(rows["cats/00.png"])
    shutil.move(target, target.with_suffix(".bak"))
    target.mkdir()  # where the image was, something no read of a file gets through (as EISDIR, EIO, EACCES do)
    with pytest.raises(DataReadError, match=rf"the image {target} \(tried twice\): IsADirectoryError"):
        dataset.get_batch(np.arange(len(dataset)))
    assert dataset.skips.skipped == {}


def test_a_read_error_that_passes_is_retried_once_and_reads_the_same_pixels(files_dataset, monkeypatch):
    dataset, _ = files_dataset
    expected = dataset.get_batch(np.arange(len(dataset)))
    calls = flaky(monkeypatch, Path, "read_bytes", failures=1, path_part="dogs/01.jpg")
    again = dataset.get_batch(np.arange(len(dataset)))
    assert calls["failed"] == 1 and np.array_equal(again.numpy(), expected.numpy())
    assert dataset.skips.skipped == {}
    flaky(monkeypatch, Path, "read_bytes", failures=2, path_part="dogs/01.jpg")  # twice: a read error, no skip
    with pytest.raises(DataReadError, match=r"dogs/01.jpg \(tried twice\): OSError: Input/output error"):
        dataset.get_batch(np.arange(len(dataset)))


def test_an_index_read_error_is_retried_once_on_a_reopened_file(tmp_path, monkeypatch):
    ids = np.asarray([f"id{i}" for i in range(100)], dtype=STRING_DTYPE)
    save_index(tmp_path / "index.npz", {"ids": ids})
    column = StoredColumn.open(tmp_path / "index.npz", "ids")
    assert column[3] == "id3"
    calls = flaky(monkeypatch, dataset_module.os, "pread", failures=1, path_part="index.npz")
    assert column[[7, 8]].tolist() == ["id7", "id8"] and calls["failed"] == 1
    flaky(monkeypatch, dataset_module.os, "pread", failures=2, path_part="index.npz")
    with pytest.raises(DataReadError, match=r"index.npz \(tried twice\): OSError: Input/output error"):
        column[9]


def test_an_index_replaced_after_it_was_opened_is_refused_where_it_is_opened_again(tmp_path):
    ids = np.asarray([f"id{i}" for i in range(100)], dtype=STRING_DTYPE)
    save_index(tmp_path / "index.npz", {"ids": ids})
    column = StoredColumn.open(tmp_path / "index.npz", "ids")
    worker_copy = pickle.loads(pickle.dumps(column))  # opens the path again on its first read
    # prepared again meanwhile: another file at the same path, the same layout, other rows
    save_index(tmp_path / "other.npz", {"ids": ids[::-1].copy()})
    os.replace(tmp_path / "other.npz", tmp_path / "index.npz")
    with pytest.raises(DataError, match="changed after the dataset was opened"):
        worker_copy[0]
    # rewritten in place (same inode, another size or time): refused as well
    column = StoredColumn.open(tmp_path / "index.npz", "ids")
    worker_copy = pickle.loads(pickle.dumps(column))
    data = (tmp_path / "index.npz").read_bytes()
    with open(tmp_path / "index.npz", "r+b") as handle:
        handle.write(data)
        handle.write(b"\0" * 16)
    with pytest.raises(DataError, match="changed after the dataset was opened"):
        worker_copy[0]
    assert StoredColumn.open(tmp_path / "index.npz", "ids")[0] == "id99"  # opened anew, it reads the new file


def test_a_missing_or_broken_image_is_still_a_broken_sample(files_dataset):
    dataset, _ = files_dataset
    rows = {sample_id: row for row, sample_id in enumerate(dataset.ids)}
    dataset.file(rows["owls/02.png"]).unlink()
    dataset.file(rows["cats/02.png"]).write_bytes(b"\x89PNG\r\n\x1a\n not a png")
    batch = dataset.get_batch(np.arange(len(dataset)))
    assert batch.shape[0] == len(dataset) and dataset.skips.stats()["skipped_unreadable_image"] == 2
