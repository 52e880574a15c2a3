"""Data modules: Trifeature generator, prepared-dataset format, image folders."""
from __future__ import annotations

import json
import os
import socket
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from contrastive.data import ImageArrayDataset
from contrastive.data import dataset as dataset_module
from contrastive.modalities.image.datasets import trifeature as trifeature_module
from contrastive.modalities.image.datasets.image_folder import prepare_image_folder
from contrastive.modalities.image.datasets.trifeature import (COLOR_NAMES, COLOR_PALETTE, SHAPE_NAMES, TEXTURE_NAMES,
                                                              generate_trifeature, prepare_trifeature)
from contrastive.errors import ConfigError, DataError

N_TRAIN, N_TEST = 900, 300


@pytest.fixture(scope="module")
def generated():
    return generate_trifeature(num_train=N_TRAIN, num_test=N_TEST, seed=0)


@pytest.fixture()
def small_dataset(tmp_path):
    return prepare_trifeature(root=tmp_path, num_train=60, num_test=20, image_size=32, num_colors=4,
                              num_shapes=4, num_textures=4, seed=1)


def _foreground(images: np.ndarray, *, threshold: float = 40.0) -> np.ndarray:
    """bool (N, H, W): pixels clearly different from the grey background."""
    diff = np.abs(images.astype(np.float32) - trifeature_module.BACKGROUND).max(axis=-1)
    return diff > threshold


# ------------------------------------------------------------------------------------------ generator
def test_shapes_and_dtypes(generated):
    images, labels = generated
    n = N_TRAIN + N_TEST
    assert images.shape == (n, 32, 32, 3) and images.dtype == np.uint8
    assert set(labels) == {"color", "shape", "texture"}
    for value in labels.values():
        assert value.shape == (n,) and value.dtype == np.int64


def test_same_seed_same_bytes_other_seed_differs():
    a, la = generate_trifeature(num_train=40, num_test=8, seed=3)
    b, lb = generate_trifeature(num_train=40, num_test=8, seed=3)
    c, _ = generate_trifeature(num_train=40, num_test=8, seed=4)
    assert a.tobytes() == b.tobytes()
    assert all(np.array_equal(la[k], lb[k]) for k in la)
    assert a.tobytes() != c.tobytes()


def test_the_bytes_do_not_depend_on_how_many_threads_render_the_chunks(monkeypatch):
    n = 3 * trifeature_module._CHUNK * 4 + 5  # several chunks of 16 px images and a partial one
    images = {}
    for cores in (1, 3):
        monkeypatch.setattr(trifeature_module, "available_cores", lambda cores=cores: cores)
        images[cores], _ = generate_trifeature(num_train=n, num_test=0, image_size=16, seed=5)
    np.testing.assert_array_equal(images[1], images[3])


def test_labels_in_range_and_roughly_uniform():
    n = 1500
    _, labels = generate_trifeature(num_train=n, num_test=0, image_size=16, num_colors=3, num_shapes=5,
                                    num_textures=6, seed=0)
    for attr, k in (("color", 3), ("shape", 5), ("texture", 6)):
        counts = np.bincount(labels[attr], minlength=k)
        assert labels[attr].min() >= 0 and len(counts) == k
        assert np.all(np.abs(counts - n / k) < 0.25 * n / k), (attr, counts)
    # Independent: colour does not predict shape.
    joint = np.bincount(labels["color"] * 5 + labels["shape"], minlength=15)
    assert np.all(np.abs(joint - n / 15) < 0.4 * n / 15)


def test_too_many_classes_is_a_config_error():
    with pytest.raises(ConfigError, match="num_colors"):
        generate_trifeature(num_train=4, num_test=0, num_colors=len(COLOR_NAMES) + 1)
    with pytest.raises(ConfigError, match="num_train"):
        generate_trifeature(num_train=0, num_test=0)


def test_name_lists_have_ten_distinct_entries():
    for names in (COLOR_NAMES, SHAPE_NAMES, TEXTURE_NAMES):
        assert len(names) == 10 and len(set(names)) == 10


def test_colour_is_identifiable_from_mean_foreground_colour(generated):
    images, labels = generated
    fg = _foreground(images)
    palette = np.asarray([COLOR_PALETTE[c] for c in COLOR_NAMES], dtype=np.float32)  # (C, 3)
    mean = (images.astype(np.float32) * fg[..., None]).sum((1, 2)) / fg.sum((1, 2))[:, None]  # (N, 3)
    # Texture darkens the colour by a factor in [DARK, 1]: compare against the best-scaled palette colour.
    scale = np.clip((mean @ palette.T) / (palette**2).sum(1), trifeature_module.DARK, 1.0)  # (N, C)
    dist = ((mean[:, None, :] - scale[..., None] * palette[None]) ** 2).sum(-1)
    accuracy = np.mean(dist.argmin(1) == labels["color"])
    assert accuracy > 0.97, accuracy


def test_shapes_are_large_and_mostly_inside(generated):
    images, _ = generated
    fg = _foreground(images, threshold=20.0)
    area = fg.mean((1, 2))
    assert area.min() > 0.06, area.min()  # big enough to show a texture
    border = np.concatenate([fg[:, 0], fg[:, -1], fg[:, :, 0], fg[:, :, -1]], axis=1).mean(1)
    assert np.median(border) < 0.15


def test_stripes_keep_their_orientation_in_the_image_frame(generated):
    images, labels = generated
    grey = images.astype(np.float32).mean(-1)
    fg = _foreground(images)
    inner_x = fg[:, :, 1:] & fg[:, :, :-1]
    inner_y = fg[:, 1:, :] & fg[:, :-1, :]
    dx = (np.abs(np.diff(grey, axis=2)) * inner_x).sum((1, 2)) / np.maximum(inner_x.sum((1, 2)), 1)
    dy = (np.abs(np.diff(grey, axis=1)) * inner_y).sum((1, 2)) / np.maximum(inner_y.sum((1, 2)), 1)
    horizontal = labels["texture"] == TEXTURE_NAMES.index("stripes_0")  # lines along x: change along y
    vertical = labels["texture"] == TEXTURE_NAMES.index("stripes_90")
    assert np.mean(dy[horizontal] > dx[horizontal]) > 0.95
    assert np.mean(dx[vertical] > dy[vertical]) > 0.95


# ------------------------------------------------------------------------------------------ prepare + load
def test_prepare_roundtrip(small_dataset):
    ds = ImageArrayDataset.load(small_dataset, verify_digest=True)
    images, labels = generate_trifeature(num_train=60, num_test=20, num_colors=4, num_shapes=4, num_textures=4,
                                         seed=1)
    assert small_dataset.name.startswith("trifeature-")
    assert np.array_equal(np.asarray(ds.images), images)
    assert all(np.array_equal(ds.labels[a], labels[a]) for a in labels)
    assert list(ds.ids[:2]) == ["tf-0000000", "tf-0000001"] and len(ds) == 80
    assert len(ds.indices("train")) == 60 and np.array_equal(ds.indices("test"), np.arange(60, 80))
    assert ds.attributes == ["color", "shape", "texture"]
    assert ds.class_names["color"] == list(COLOR_NAMES[:4])
    manifest = json.loads((small_dataset / "manifest.json").read_text())
    assert manifest["num_train"] == 60 and manifest["num_test"] == 20 and manifest["image_size"] == 32
    assert manifest["kind"] == "trifeature" and len(manifest["digest"]) == 64 and manifest["params"]["seed"] == 1


def test_prepare_reuses_finished_dataset(small_dataset, tmp_path, monkeypatch):
    before = {p.name: p.stat().st_mtime_ns for p in small_dataset.iterdir()}

    def fail(**_):
        raise AssertionError("regenerated although a finished dataset exists")

    monkeypatch.setattr(trifeature_module, "generate_trifeature", fail)
    again = prepare_trifeature(root=tmp_path, num_train=60, num_test=20, image_size=32, num_colors=4,
                               num_shapes=4, num_textures=4, seed=1)
    assert again == small_dataset
    assert {p.name: p.stat().st_mtime_ns for p in again.iterdir()} == before
    monkeypatch.undo()
    other = prepare_trifeature(root=tmp_path, num_train=60, num_test=20, image_size=32, num_colors=4,
                               num_shapes=4, num_textures=4, seed=2)
    assert other != small_dataset


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        (args[0] / "images.npy").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(trifeature_module, "write_dataset_files", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare_trifeature(root=tmp_path, num_train=8, num_test=0)
    assert list(tmp_path.iterdir()) == []


def test_leftover_temp_dir_and_half_target_are_ignored_and_cleaned(tmp_path):
    first = prepare_trifeature(root=tmp_path, num_train=8, num_test=4)
    for child in first.iterdir():
        child.unlink()
    (first / "images.npy").write_bytes(b"half written")  # no manifest: not a finished dataset
    stale = tmp_path / f".{first.name}.tmp-{socket.gethostname()}-999999999-dead"
    stale.mkdir()
    (stale / "images.npy").write_bytes(b"junk")
    path = prepare_trifeature(root=tmp_path, num_train=8, num_test=4)
    assert path == first and len(ImageArrayDataset.load(path)) == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]


def test_concurrent_prepares_agree(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3) as pool:
        paths = list(pool.map(lambda _: prepare_trifeature(root=tmp_path, num_train=200, num_test=0), range(3)))
    assert len(set(paths)) == 1
    assert len(ImageArrayDataset.load(paths[0], verify_digest=True)) == 200
    assert [p.name for p in tmp_path.iterdir()] == [paths[0].name]


def test_load_errors_name_the_fix(small_dataset, tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        ImageArrayDataset.load(tmp_path / "nope")
    (small_dataset / "index.npz").rename(small_dataset / "index.bak")
    with pytest.raises(DataError, match=r"missing index.npz.*mclpipe run"):
        ImageArrayDataset.load(small_dataset)
    (small_dataset / "index.bak").rename(small_dataset / "index.npz")
    images_bytes = (small_dataset / "images.npy").read_bytes()
    (small_dataset / "images.npy").write_bytes(images_bytes[: len(images_bytes) // 2])
    with pytest.raises(DataError, match="unreadable"):
        ImageArrayDataset.load(small_dataset)
    (small_dataset / "images.npy").write_bytes(images_bytes)
    (small_dataset / "index.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="index.npz is unreadable"):
        ImageArrayDataset.load(small_dataset)
    (small_dataset / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="manifest.json is corrupt"):
        ImageArrayDataset.load(small_dataset)


def test_digest_detects_changed_pixels(small_dataset):
    array = np.load(small_dataset / "images.npy", mmap_mode="r+")
    array[0, 0, 0, 0] ^= 1
    array.flush()
    del array
    ImageArrayDataset.load(small_dataset)  # cheap load does not hash
    with pytest.raises(DataError, match="changed after it was written"):
        ImageArrayDataset.load(small_dataset, verify_digest=True)


def test_get_batch_matches_direct_indexing(small_dataset):
    ds = ImageArrayDataset.load(small_dataset)
    idx = np.array([17, 3, 79, 3, 0, 42])
    batch = ds.get_batch(idx)
    expected = torch.from_numpy(np.asarray(ds.images)[idx]).permute(0, 3, 1, 2)
    assert batch.dtype == torch.uint8 and batch.shape == (6, 3, 32, 32) and batch.is_contiguous()
    assert torch.equal(batch, expected)
    assert torch.equal(ds.get_batch(torch.tensor(idx)), expected)
    with pytest.raises(IndexError):
        ds.get_batch([80])


def test_verify_ids(small_dataset):
    ds = ImageArrayDataset.load(small_dataset)
    train_ids = ds.ids[ds.indices("train")]
    ds.verify_ids(train_ids, split="train")
    ds.verify_ids(list(ds.ids))
    swapped = train_ids.copy()
    swapped[[0, 1]] = swapped[[1, 0]]
    with pytest.raises(DataError, match=r"2 of 60 ids differ.*different order"):
        ds.verify_ids(swapped, split="train")
    with pytest.raises(DataError, match="got 59 ids"):
        ds.verify_ids(train_ids[:-1], split="train")
    with pytest.raises(ConfigError, match="unknown split"):
        ds.indices("val")


# ------------------------------------------------------------------------------------------ image folders
def _write_png(path, colour, size=(20, 12)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


def _class_folder(root, per_class=4):
    colours = {"cats": (200, 10, 10), "dogs": (10, 200, 10), "owls": (10, 10, 200)}
    for name, colour in colours.items():
        for i in range(per_class):
            _write_png(root / name / f"{i:02d}.png", colour)
    return colours


def test_image_folder_with_class_subfolders(tmp_path):
    colours = _class_folder(tmp_path / "src")
    path = prepare_image_folder(source=tmp_path / "src", root=tmp_path / "cache", image_size=16, labels_csv=None,
                                test_fraction=0.25, seed=0)
    ds = ImageArrayDataset.load(path, verify_digest=True)
    assert len(ds) == 12 and ds.images.shape == (12, 16, 16, 3)
    assert ds.ids[0] == "cats/00.png" and list(ds.ids) == sorted(ds.ids)
    assert ds.class_names == {"class": ["cats", "dogs", "owls"]}
    assert np.array_equal(ds.labels["class"], np.repeat([0, 1, 2], 4))
    assert len(ds.indices("test")) == 3
    for row, sample_id in enumerate(ds.ids):
        assert tuple(ds.images[row, 8, 8]) == colours[sample_id.split("/")[0]]
    again = prepare_image_folder(source=tmp_path / "src", root=tmp_path / "cache", image_size=16,
                                 labels_csv=None, test_fraction=0.25, seed=0)
    assert again == path
    os.utime(tmp_path / "src" / "cats" / "00.png", ns=(1, 1))  # an edited file is a new dataset
    changed = prepare_image_folder(source=tmp_path / "src", root=tmp_path / "cache", image_size=16,
                                   labels_csv=None, test_fraction=0.25, seed=0)
    assert changed != path


def test_image_folder_with_csv_labels(tmp_path):
    src = tmp_path / "src"
    for i in range(6):
        _write_png(src / f"img{i}.jpg" if i == 5 else src / f"img{i}.png", (i * 40, 0, 0))
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("id,size,shade,split\n"
                        "img0.png,big,dark,test\n"
                        "./img1.png,small,,train\n"
                        "img2.png,big,light,\n"
                        "img5.jpg,small,light,test\n")
    path = prepare_image_folder(source=src, root=tmp_path / "cache", image_size=8, labels_csv=csv_path,
                                test_fraction=0.5, seed=0)
    ds = ImageArrayDataset.load(path)
    assert list(ds.ids) == ["img0.png", "img1.png", "img2.png", "img3.png", "img4.png", "img5.jpg"]
    assert ds.class_names == {"size": ["big", "small"], "shade": ["dark", "light"]}
    assert ds.labels["size"].tolist() == [0, 1, 0, -1, -1, 1]
    assert ds.labels["shade"].tolist() == [0, -1, 1, -1, -1, 1]
    assert ds.split[0] == "test" and ds.split[1] == "train" and ds.split[5] == "test"


def test_image_folder_csv_errors(tmp_path):
    src = tmp_path / "src"
    _class_folder(src, per_class=1)
    bad_header = tmp_path / "bad.csv"
    bad_header.write_text("file,label\ncats/00.png,a\n")
    with pytest.raises(DataError, match="no 'id'"):
        prepare_image_folder(source=src, root=tmp_path / "c", image_size=8, labels_csv=bad_header,
                             test_fraction=0.5, seed=0)
    unknown = tmp_path / "unknown.csv"
    unknown.write_text("path,label\ncats/00.png,a\nx.png,b\ny.png,b\nz.png,b\nw.png,b\n")
    with pytest.raises(DataError, match=r"4 id\(s\) match no image.*'x.png', 'y.png', 'z.png';"):
        prepare_image_folder(source=src, root=tmp_path / "c", image_size=8, labels_csv=unknown,
                             test_fraction=0.5, seed=0)


def test_image_folder_corrupt_files(tmp_path):
    src = tmp_path / "src"
    for i in range(100):
        _write_png(src / f"a{i:03d}.png", (i, i, i), size=(4, 4))
    (src / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.warns(UserWarning, match=r"skipped 1 unreadable image\(s\) of 101.*broken.png"):
        path = prepare_image_folder(source=src, root=tmp_path / "c", image_size=4, labels_csv=None,
                                    test_fraction=0.2, seed=0)
    ds = ImageArrayDataset.load(path, verify_digest=True)
    assert len(ds) == 100 and "broken.png" not in set(ds.ids)
    assert ds.images[7, 0, 0].tolist() == [7, 7, 7] and ds.ids[7] == "a007.png"
    (src / "broken2.png").write_bytes(b"")
    with pytest.raises(DataError, match=r"2 of 102 images.*unreadable.*broken.png"):
        prepare_image_folder(source=src, root=tmp_path / "c", image_size=4, labels_csv=None,
                             test_fraction=0.2, seed=0)
    assert not any(p.name.startswith(".") for p in (tmp_path / "c").iterdir())


def test_image_folder_missing_source_and_no_images(tmp_path):
    with pytest.raises(DataError, match="does not exist.*data.image_folder.source"):
        prepare_image_folder(source=tmp_path / "missing", root=tmp_path / "c", image_size=8, labels_csv=None,
                             test_fraction=0.5, seed=0)
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "notes.txt").write_text("hi")
    with pytest.raises(DataError, match=r"no images found.*\.jpg, \.jpeg, \.png, \.webp, \.bmp"):
        prepare_image_folder(source=tmp_path / "empty", root=tmp_path / "c", image_size=8, labels_csv=None,
                             test_fraction=0.5, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _write_png(tmp_path / "flat" / "a.png", (1, 2, 3))
        _write_png(tmp_path / "flat" / "b.png", (1, 2, 3))
        ds = ImageArrayDataset.load(prepare_image_folder(source=tmp_path / "flat", root=tmp_path / "c",
                                                         image_size=8, labels_csv=None, test_fraction=0.5,
                                                         seed=0))
    assert ds.attributes == [] and sorted(ds.split.tolist()) == ["test", "train"]


def test_library_does_not_import_orchestration():
    import contrastive.data.dataset as d
    import contrastive.modalities.image.datasets.image_folder as f
    for module in (d, f, trifeature_module, dataset_module):
        source = open(module.__file__).read()
        assert "import prefect" not in source and "import mlflow" not in source
