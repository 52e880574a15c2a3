"""Index columns read from disk (``StoredColumn``), views of a column at a split's rows (``RowsOf``), and a
file-backed dataset whose ids, split and labels stay on disk: each equal, element for element, to the array it
stands for, and none read whole where a slice or the rows asked for will do."""
from __future__ import annotations

import pickle
import zipfile

import numpy as np
import pytest

from contrastive.data import dataset as dataset_module
from contrastive.data.dataset import (STRING_DTYPE, RowsOf, StoredColumn, column_on_disk, npz_member_equals,
                                      save_index, scratch_dir)
from contrastive.data.loading import load_dataset
from contrastive.errors import DataError
from contrastive.mcl.steps import load_pseudo_labels, stage_sampler
from contrastive.modalities.image.datasets.image_folder import prepare_image_folder

N = 5_000


def _ids(n=N):
    # lengths from 3 to 40 characters, non-ASCII too: the <U width is the longest, as every index writes them
    return np.asarray([f"c{i % 7}/é{i}" + "x" * (i % 31) + ".jpg" for i in range(n)], dtype=STRING_DTYPE)


@pytest.fixture()
def stored(tmp_path):
    ids, numbers = _ids(), np.arange(N, dtype=np.int64) * 3 - 7
    save_index(tmp_path / "index.npz", {"ids": ids, "numbers": numbers})
    return ids, numbers, StoredColumn.open(tmp_path / "index.npz", "ids"), StoredColumn.open(tmp_path / "index.npz",
                                                                                              "numbers")


@pytest.mark.parametrize("key", [
    3, -1, slice(None), slice(10, 4_000, 7), slice(4_990, 9_999), slice(5, 2),
    [4, 4, 0, 4_999], np.array([], dtype=np.int64), np.arange(N)[::-1], "random", "mask"])
def test_indexing_a_stored_column_equals_indexing_the_array(stored, key):
    ids, numbers, column, number_column = stored
    rng = np.random.default_rng(0)
    key = {"random": rng.integers(0, N, 700), "mask": rng.random(N) < 0.3}.get(key, key) if isinstance(key, str) \
        else key
    for array, col in ((ids, column), (numbers, number_column)):
        got, want = col[key], array[key]
        if np.ndim(want) == 0:
            assert got == want and type(got) is type(want)
        else:
            assert got.dtype == array.dtype and got.tolist() == want.tolist()


def test_reads_span_the_rows_asked_for_not_the_column(stored, monkeypatch):
    ids, _, column, _ = stored
    spans = []
    read = StoredColumn._pread
    monkeypatch.setattr(StoredColumn, "_pread", lambda self, a, b: spans.append(b - a) or read(self, a, b))
    rows = np.array([4_000, 10, 11, 12, 2_000])
    assert column[rows].tolist() == ids[rows].tolist()
    # 10..12 close together: one read; the others one each; nothing near the 5,000 rows
    assert sorted(spans) == [1, 1, 3]
    spans.clear()
    monkeypatch.setattr(dataset_module, "_READ_BYTES", 40 * column._stored.itemsize)
    assert column[:].tolist() == ids.tolist() and max(spans) <= 40
    spans.clear()  # rows all close together: read in runs of at most _READ_BYTES too
    assert column[np.arange(N)[::-2]].tolist() == ids[::-1][::2].tolist() and max(spans) <= 40


def test_a_stored_column_behaves_as_its_array_where_callers_use_one(stored):
    ids, numbers, column, number_column = stored
    assert len(column) == N and column.shape == (N,) and column.dtype == STRING_DTYPE
    assert list(column) == ids.tolist() and column.tolist() == ids.tolist()
    assert np.array_equal(np.asarray(column), ids) and np.array_equal(np.asarray(number_column), numbers)
    assert np.array_equal(np.flatnonzero(column == ids[17]), [17])
    assert (column != ids).sum() == 0
    copy = pickle.loads(pickle.dumps(column))  # a DataLoader worker: the path, not the strings
    assert len(pickle.dumps(column)) < 1_000 and copy[[3, 1]].tolist() == ids[[3, 1]].tolist()
    with pytest.raises(IndexError):
        column[N]
    with pytest.raises(IndexError):
        column[np.array([0, N])]


def test_a_compressed_column_is_not_read_in_place_and_a_cut_one_is_an_error(tmp_path):
    np.savez_compressed(tmp_path / "z.npz", ids=_ids(10).astype("<U40"))
    assert StoredColumn.open(tmp_path / "z.npz", "ids") is None
    np.savez(tmp_path / "u.npz", ids=_ids(10).astype("<U40"))  # what earlier versions wrote: read in place
    assert StoredColumn.open(tmp_path / "u.npz", "ids")[[9, 0]].tolist() == _ids(10)[[9, 0]].tolist()
    column = StoredColumn.open(tmp_path / "u.npz", "ids")
    assert column[0] == _ids(10)[0]  # its file is open: cut now, the file it reads ends early
    data = (tmp_path / "u.npz").read_bytes()
    (tmp_path / "u.npz").write_bytes(data[:column._offset + 3 * column._stored.itemsize])  # cut after opening
    with pytest.raises(DataError, match="ends inside its 'ids' column.*prepare the dataset again"):
        column[8]
    with pytest.raises((ValueError, zipfile.BadZipFile)):
        StoredColumn.open(tmp_path / "u.npz", "ids")


def test_rows_of_is_the_column_at_the_rows_without_the_copy(stored, tmp_path):
    ids, _, column, _ = stored
    rows = np.flatnonzero(np.arange(N) % 3 != 1)
    for values in (ids, column):
        view = RowsOf(values, rows)
        assert len(view) == rows.size and view.shape == rows.shape and view.dtype == STRING_DTYPE
        assert view[5] == ids[rows[5]] and view[[7, 2]].tolist() == ids[rows[[7, 2]]].tolist()
        assert np.asarray(view).tolist() == ids[rows].tolist()
    save_index(tmp_path / "labels.npz", {"ids": ids[rows], "groups": np.arange(rows.size) % 5})
    assert npz_member_equals(tmp_path / "labels.npz", "ids", RowsOf(column, rows))
    assert not npz_member_equals(tmp_path / "labels.npz", "ids", RowsOf(column, rows[::-1]))
    # the reader of pseudo-labels: in the same order read by slices, in another order joined by id
    assert load_pseudo_labels(path=tmp_path / "labels.npz", ids=RowsOf(column, rows)).tolist() == \
        (np.arange(rows.size) % 5).tolist()
    assert load_pseudo_labels(path=tmp_path / "labels.npz", ids=RowsOf(column, rows[::-1])).tolist() == \
        (np.arange(rows.size) % 5)[::-1].tolist()


def test_a_column_on_disk_lives_in_a_scratch_dir_that_is_gone_after_it(tmp_path):
    with scratch_dir(tmp_path / "listing") as scratch:
        ids = _ids(100)
        column = column_on_disk([ids[:40], ids[40:40], ids[40:]], path=scratch / "ids.npz")  # blocks, in order
        assert scratch.parent == tmp_path and scratch.name.startswith(".listing.tmp-")
        assert column.tolist() == ids.tolist() and column._stored == np.dtype(f"<U{max(map(len, ids.tolist()))}")
        assert column_on_disk(ids, path=scratch / "one.npz").tolist() == ids.tolist()  # one array: one block
    assert list(tmp_path.iterdir()) == []


def _image_folder(root, *, count=12):
    from PIL import Image
    for i in range(count):
        path = root / f"{'cats' if i % 2 else 'dogs'}" / f"{i:02d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (10, 8), (20 * i, 40, 90)).save(path, format="JPEG")
    return root


def test_a_file_backed_dataset_keeps_its_index_on_disk_and_plans_from_it(tmp_path):
    source = _image_folder(tmp_path / "images")
    path = prepare_image_folder(source=source, root=tmp_path / "cache", image_size=8, storage="files",
                                test_fraction=0.25, seed=3)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [path.name]  # no scratch left behind
    dataset = load_dataset(path)
    assert all(isinstance(c, StoredColumn) for c in (dataset.ids, dataset.split, dataset.labels["class"]))
    with np.load(path / "index.npz") as stored:
        ids, split, labels = stored["ids"], stored["split"], stored["label_class"]
    assert dataset.ids.tolist() == ids.tolist() and dataset.labels["class"].tolist() == labels.tolist()
    train = dataset.indices("train")
    assert train.tolist() == np.flatnonzero(split == "train").tolist() and len(train) == 9
    assert dataset.digest == dataset.compute_digest()
    save_index(tmp_path / "pl.npz", {"ids": ids[train], "groups": np.arange(train.size) % 2})
    plan = stage_sampler(dataset=dataset, pseudo_labels_path=tmp_path / "pl.npz", batch_size=2, seed=0,
                         remainder_policy="drop")
    assert plan.groups.tolist() == (np.arange(train.size) % 2).tolist()
    for batch in plan.sampler:  # cluster-pure: each batch one group
        assert len({int(plan.groups[row]) for row in batch}) == 1


def test_a_folder_prepared_before_is_found_without_writing_anything(tmp_path, monkeypatch):
    # a team's cache of prepared folders may be mounted read-only: finding one must not need the scratch listing
    from contrastive.modalities.image.datasets import image_folder
    source = _image_folder(tmp_path / "images")
    first = prepare_image_folder(source=source, root=tmp_path / "cache", image_size=8, storage="files")

    def no_writes(target):
        raise AssertionError(f"wrote a scratch directory next to {target}")

    monkeypatch.setattr(image_folder, "scratch_dir", no_writes)
    assert prepare_image_folder(source=source, root=tmp_path / "cache", image_size=8, storage="files") == first


def test_threads_reading_a_fresh_column_open_its_file_once(stored, monkeypatch):
    import threading
    ids, _, column, _ = stored
    opened = []
    real_open = open

    def counting_open(*args, **kwargs):
        opened.append(args[0])
        return real_open(*args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    barrier = threading.Barrier(8)
    results = [None] * 8

    def read(i):
        barrier.wait()
        results[i] = [column[j] for j in range(i, N, 97)]

    threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert opened == [column.path]
    assert all(results[i] == ids[i::97].tolist() for i in range(8))


def test_an_image_batch_reads_its_ids_only_when_its_keys_are_asked_for(stored, monkeypatch):
    import torch

    from contrastive.engine.distributed import DistInfo
    from contrastive.mcl.sampler import ClusterBatchSampler
    from contrastive.modalities.image.adapter import ImageBatchSource
    ids, _, column, _ = stored
    train_rows = np.arange(0, N, 5)
    reads = []
    read = StoredColumn._pread
    monkeypatch.setattr(StoredColumn, "_pread", lambda self, a, b: reads.append((a, b)) or read(self, a, b))
    source = ImageBatchSource(
        sampler=ClusterBatchSampler(groups=None, num_samples=train_rows.size, batch_size=16, seed=0),
        ids=RowsOf(column, train_rows), groups=None, info=DistInfo(),
        read_batches=lambda planned: ((rows, torch.zeros((len(rows), 3, 2, 2), dtype=torch.uint8))
                                      for rows in planned))
    batches = list(source.batches(epoch=0, start=0))
    assert len(batches) == len(source) and reads == []  # the training step never needs them
    assert [b.keys for b in batches[:3]] == [ids[train_rows[b.rows]].tolist() for b in batches[:3]]
