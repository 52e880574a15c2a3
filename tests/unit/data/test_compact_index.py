"""Sample ids of a file-backed index are held compactly (StringDType, not 4 bytes a character of ``<U``), while the
index on disk keeps the format earlier versions wrote and read."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from contrastive.data import dataset as dataset_module
from contrastive.data.dataset import (INDEX_FILE, MANIFEST_FILE, STRING_DTYPE, chunks_of, repeated_strings, save_index,
                                      saveable_ids, string_hashes)
from contrastive.data.image_decode import file_index_digest
from contrastive.data.image_files import ImageFileDataset
from contrastive.data.loading import load_dataset
from contrastive.errors import DataError
from contrastive.mcl.ids import align_labels_to_ids
from contrastive.modalities.image.datasets import image_folder
from contrastive.modalities.image.datasets.image_folder import IMAGE_EXTENSIONS, list_images, prepare_image_folder

NAMES = ["cats/é-001.jpg", "cats/b.jpg", "dogs/日本/2.jpg", "dogs/a.jpg", "dogs/z.JPEG"]


def _folder(tmp_path):
    from PIL import Image
    source = tmp_path / "images"
    for i, name in enumerate(NAMES):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (12, 10), (40 * i, 20, 200)).save(source / name, format="JPEG")
    (source / ".hidden.jpg").write_bytes(b"x")
    return source


def test_list_images_is_sorted_string_arrays_not_a_list_of_str(tmp_path):
    blocks = list_images(_folder(tmp_path))
    assert all(isinstance(b, np.ndarray) and b.dtype == STRING_DTYPE for b in blocks)
    assert np.concatenate(blocks).tolist() == sorted(NAMES)  # the order sorted() gives the str, non-ASCII too


def _os_walk_listing(source):
    """What the listing was before the sorted walk: os.walk (hidden entries skipped), then one sort."""
    found = []
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        folder = os.path.relpath(dirpath, source).replace(os.sep, "/")
        found += [("" if folder == "." else folder + "/") + name for name in filenames
                  if not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)]
    return sorted(found)


def test_the_sorted_walk_lists_what_os_walk_and_a_sort_did_in_blocks(tmp_path, monkeypatch):
    source = tmp_path / "images"
    # folders whose names sort differently with and without the "/" after them, files beside folders of the same
    # stem, upper case, non-ASCII, hidden files and folders, a linked folder (not entered), a linked file (listed)
    names = ["a.jpg", "a/b.jpg", "a-b/c.png", "a0/x.jpg", "A/z.JPG", "a/é/1.jpg", "a/e/2.jpg", "b.txt", "ab.jpg",
             ".hidden/q.jpg", "a/.q.jpg", "zz/yy/xx/deep.webp"]
    for name in names:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(b"x")
    (source / "linked").symlink_to(source / "a", target_is_directory=True)
    (source / "link.jpg").symlink_to(source / "a.jpg")
    monkeypatch.setattr(image_folder, "ID_CHUNK", 3)
    blocks = list_images(source)
    assert [len(b) for b in blocks[:-1]] == [3] * (len(blocks) - 1)
    listed = np.concatenate(blocks).tolist()
    assert listed == _os_walk_listing(source) and "link.jpg" in listed and not any("linked/" in p for p in listed)


def test_a_prepared_index_holds_its_ids_as_strings_and_writes_them_as_before(tmp_path):
    source = _folder(tmp_path)
    path = prepare_image_folder(source=source, root=tmp_path / "data", image_size=8, storage="files", seed=1)
    dataset = load_dataset(path)
    assert isinstance(dataset, ImageFileDataset)
    assert dataset.ids.dtype == STRING_DTYPE and dataset.split.dtype == STRING_DTYPE
    assert dataset.ids.tolist() == sorted(NAMES)
    assert dataset.class_names == {"class": ["cats", "dogs"]}
    assert dataset.labels["class"].tolist() == [0 if n.startswith("cats") else 1 for n in sorted(NAMES)]
    assert all(dataset.file(row).is_file() for row in range(len(dataset)))
    assert dataset.read(dataset.ids.tolist().index("dogs/日本/2.jpg")).shape == (3, 8, 8)
    dataset.verify_digest()
    with np.load(path / INDEX_FILE, allow_pickle=False) as stored:  # the on-disk format is unchanged: <U
        assert stored["ids"].dtype.kind == "U" and stored["ids"].tolist() == sorted(NAMES)
        assert stored["split"].dtype.kind == "U"
        old_style = {name: stored[name] for name in stored.files}
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert file_index_digest(index=old_style, params=manifest["params"]) == manifest["digest"]


def test_an_index_written_by_np_savez_still_loads(tmp_path):
    source = _folder(tmp_path)
    path = prepare_image_folder(source=source, root=tmp_path / "data", image_size=8, storage="files")
    with np.load(path / INDEX_FILE, allow_pickle=False) as stored:
        arrays = {name: stored[name] for name in stored.files}
    np.savez(path / INDEX_FILE, **arrays)  # what earlier versions wrote (<U, a 1.0 header)
    dataset = load_dataset(path, verify_digest=True)
    assert dataset.ids.dtype == STRING_DTYPE and dataset.ids.tolist() == sorted(NAMES)


def test_a_pickled_id_column_is_refused_with_the_fix(tmp_path):
    source = _folder(tmp_path)
    path = prepare_image_folder(source=source, root=tmp_path / "data", image_size=8, storage="files")
    with np.load(path / INDEX_FILE, allow_pickle=False) as stored:
        arrays = {name: stored[name] for name in stored.files}
    arrays["ids"] = arrays["ids"].astype(object)
    np.savez(path / INDEX_FILE, **arrays)
    with pytest.raises(DataError, match="run `mclpipe run` again"):
        load_dataset(path)


def test_save_index_round_trips_and_saveable_ids_gives_u(tmp_path):
    ids = np.asarray(["a", "ü/ß" * 30, "c"], dtype=STRING_DTYPE)
    save_index(tmp_path / "i.npz", {"ids": ids, "label_x": np.arange(3)})
    with np.load(tmp_path / "i.npz", allow_pickle=False) as stored:
        assert stored["ids"].tolist() == ids.tolist() and stored["ids"].dtype == np.dtype("<U90")
        assert stored["label_x"].tolist() == [0, 1, 2]
    assert saveable_ids(ids).dtype == np.dtype("<U90")


def test_repeated_strings_names_each_repeat_once_in_order_of_its_second_occurrence(monkeypatch):
    monkeypatch.setattr(dataset_module, "ID_CHUNK", 2)  # repeats across chunks
    for kind in (STRING_DTYPE, None):
        values = np.asarray(["b", "a", "ü/ß" * 9, "c", "a", "b", "a", "ü/ß" * 9, "d"], dtype=kind)
        assert repeated_strings(chunks_of(values), count=len(values)) == ["a", "b", "ü/ß" * 9]
        assert repeated_strings(chunks_of(values), count=len(values), examples=1) == ["a"]
        assert repeated_strings(chunks_of(values[[0, 1, 2, 3, 8]]), count=5) == []


def test_equal_hashes_of_different_strings_are_told_apart_by_the_strings(monkeypatch):
    """Every string hashes alike: the second pass compares the strings themselves."""
    monkeypatch.setattr(dataset_module, "string_hashes", lambda values: np.zeros(len(values), np.uint64))
    values = np.asarray(["x", "y", "z", "y"], dtype=STRING_DTYPE)
    assert repeated_strings(chunks_of(values), count=4) == ["y"]
    assert repeated_strings(chunks_of(values[:3]), count=3) == []


def test_string_hashes_are_fnv1a_of_the_code_points_whatever_the_array_kind():
    def fnv1a(text):  # the 64-bit FNV-1a of the code points, by hand
        value = 0xCBF29CE484222325
        for char in text:
            value = ((value ^ ord(char)) * 0x100000001B3) % 2**64
        return value
    texts = ["", "a", "dogs/日本/2.jpg", "longer-than-fifteen-characters"]
    expected = [fnv1a(text) for text in texts]
    assert string_hashes(np.asarray(texts)).tolist() == expected
    assert string_hashes(np.asarray(texts, dtype=STRING_DTYPE)).tolist() == expected


def test_a_datasets_ids_join_labels_listed_in_another_order_at_any_size():
    """numpy 2.4's searchsorted on StringDType arrays of more than a few elements returns wrong positions: the join
    of a dataset's ids (StringDType) with labels keyed by <U, S or StringDType ids must not go through it."""
    names = [f"c{i % 3}/b{i // 1000:05d}/{i:08d}.jpg" for i in range(3000)]
    dataset_ids = np.asarray(names[::2], dtype=STRING_DTYPE)
    order = np.random.default_rng(0).permutation(len(names))
    listed = np.asarray(names)[order]
    for label_ids in (listed, listed.astype(STRING_DTYPE), np.strings.encode(listed, "utf-8")):
        out = align_labels_to_ids(label_ids=label_ids, labels=order, dataset_ids=dataset_ids)
        assert out.tolist() == list(range(0, 3000, 2))


def test_labels_align_by_id_across_string_kinds():
    dataset_ids = np.asarray(["b/é", "a/1", "c/3"], dtype=STRING_DTYPE)
    for label_ids in (np.asarray(["c/3", "b/é", "a/1"]), np.strings.encode(np.asarray(["c/3", "b/é", "a/1"]), "utf-8")):
        out = align_labels_to_ids(label_ids=label_ids, labels=np.asarray([30, 10, 20]), dataset_ids=dataset_ids)
        assert out.tolist() == [10, 20, 30]
