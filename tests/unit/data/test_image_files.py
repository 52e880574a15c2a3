"""File-backed image folders (storage "files"), the batch reader with DataLoader workers, the shared skip counter."""
from __future__ import annotations

import io
import pickle
import shutil
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from contrastive.modalities.image_text import data as clip_data
from contrastive.data.dataset import ImageArrayDataset
from contrastive.data.image_files import ImageFileDataset
from contrastive.data.loading import load_dataset
from contrastive.data import image_decode
from contrastive.modalities.image.datasets import image_folder
from contrastive.data.image_decode import load_square_rgb
from contrastive.modalities.image.datasets.image_folder import prepare_image_folder
from contrastive.data.loading import iter_batches
from contrastive.data.skips import SkipCounter
from contrastive.modalities.image.datasets.trifeature import prepare_trifeature
from contrastive.errors import ConfigError, DataError
from contrastive.modalities.image.config import DataConfig, ImageFolderConfig

SIZE = 12


def _noise(seed: int, size: tuple[int, int], mode: str = "RGB") -> Image.Image:
    """A random picture (width, height): resizing and cropping it wrongly changes its pixels."""
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "L": 1}[mode]
    pixels = rng.integers(0, 256, size=(size[1], size[0], channels), dtype=np.uint8)
    return Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode)


def _save(image: Image.Image, path, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format=fmt)


def _class_folder(root, *, per_class: int = 3):
    """cats/ dogs/ owls/ with PNG and JPEG files of different, non-square sizes (one grayscale)."""
    for c, name in enumerate(("cats", "dogs", "owls")):
        for i in range(per_class):
            seed = 10 * c + i
            size = (20 + 3 * i + c, 14 + 2 * c)  # landscape
            if i == 1:
                size = size[::-1]  # portrait
            if (c, i) == (2, 0):
                _save(_noise(seed, size, "L"), root / name / f"{i:02d}.png", "PNG")
            elif i % 2:
                _save(_noise(seed, size), root / name / f"{i:02d}.jpg", "JPEG")
            else:
                _save(_noise(seed, size), root / name / f"{i:02d}.png", "PNG")
    return root


def _add_broken(root) -> list[str]:
    """A corrupt PNG and a zero-byte JPEG among the class folders; returns their ids."""
    (root / "cats" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n definitely not a png")
    (root / "dogs" / "empty.jpg").write_bytes(b"")
    return ["cats/corrupt.png", "dogs/empty.jpg"]


def _imagenet_folder(root):
    """ImageNet's layout: train/<wnid>/*.JPEG and val/<wnid>/*.JPEG."""
    for s, split in enumerate(("train", "val")):
        for c, wnid in enumerate(("n01440764", "n01443537")):
            for i in range(4 if split == "train" else 2):
                _save(_noise(100 * s + 10 * c + i, (24, 18)), root / split / wnid / f"{wnid}_{i}.JPEG", "JPEG")
    return root


def _prepare(source, root, storage: str, **kwargs):
    return prepare_image_folder(source=source, root=root, image_size=SIZE, labels_csv=None, test_fraction=0.25,
                                seed=0, storage=storage, **kwargs)


def _dir_bytes(path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------ the index
def test_file_index_holds_no_pixels(tmp_path):
    """The "files" directory is an index: its size depends on the number of images, not on their pixels."""
    sizes = {}
    for name, side, count in (("small", 16, 6), ("large", 256, 6), ("more", 16, 30)):
        src = tmp_path / name / "src"
        for i in range(count):
            _save(_noise(i, (side, side)), src / f"c{i % 2}" / f"{i:03d}.png", "PNG")
        path = _prepare(src, tmp_path / name / "cache", "files")
        assert sorted(p.name for p in path.iterdir()) == ["index.npz", "manifest.json"]
        sizes[name] = _dir_bytes(path)
    assert abs(sizes["large"] - sizes["small"]) < 16  # 256x256 images cost the same as 16x16 ones
    assert sizes["more"] - sizes["small"] < 24 * 200  # O(N) bytes per image (ids, split, labels)
    memory = _prepare(tmp_path / "large" / "src", tmp_path / "large" / "cache", "memory")
    assert (memory / "images.npy").is_file() and memory != _prepare(tmp_path / "large" / "src",
                                                                  tmp_path / "large" / "cache", "files")


def test_load_dataset_picks_the_class_from_the_directory(tmp_path):
    src = _class_folder(tmp_path / "src")
    files = load_dataset(_prepare(src, tmp_path / "c", "files"), verify_digest=True)
    memory = load_dataset(_prepare(src, tmp_path / "c", "memory"), verify_digest=True)
    trifeature = load_dataset(prepare_trifeature(root=tmp_path / "t", num_train=16, num_test=16, image_size=16,
                                                 num_colors=2, num_shapes=2, num_textures=2, seed=0))
    assert type(files) is ImageFileDataset and type(memory) is ImageArrayDataset
    assert type(trifeature) is ImageArrayDataset
    assert files.source == src.resolve() and files.image_size == SIZE and len(files) == 9
    with pytest.raises(DataError, match="does not exist"):
        load_dataset(tmp_path / "nothing-here")
    shutil.move(src, tmp_path / "moved")
    with pytest.raises(DataError, match="no longer exists.*data.image_folder.source"):
        load_dataset(files.path)


def test_a_new_file_or_an_edit_makes_a_new_index_and_digest(tmp_path):
    src = _class_folder(tmp_path / "src")
    first = _prepare(src, tmp_path / "c", "files")
    assert _prepare(src, tmp_path / "c", "files") == first  # reused
    _save(_noise(99, (20, 20)), src / "owls" / "new.png", "PNG")
    second = _prepare(src, tmp_path / "c", "files")
    assert second != first and load_dataset(second).digest != load_dataset(first).digest
    assert "owls/new.png" in set(load_dataset(second).ids)
    with pytest.raises(ConfigError, match="data.image_folder.storage"):
        _prepare(src, tmp_path / "c", "disk")


# ------------------------------------------------------------------------------------------ decoding one file
def test_read_resizes_the_shorter_side_and_centre_crops(tmp_path):
    """A 40x20 image whose central 20x20 square is blue, with a red strip left and a green one right: the crop
    keeps the square. The result equals resizing the shorter side to S and cropping S (up to resampling)."""
    pixels = np.zeros((20, 40, 3), dtype=np.uint8)
    pixels[:, :10] = (255, 0, 0)
    pixels[:, 10:30] = (0, 0, 255)
    pixels[:, 30:] = (0, 255, 0)
    pixels[5:15, 15:25] = (255, 255, 255)  # a white square, half the crop's side, in the middle
    _save(Image.fromarray(pixels), tmp_path / "src" / "wide.png", "PNG")
    tall = np.ascontiguousarray(pixels.transpose(1, 0, 2))  # 20 wide, 40 high: strips top and bottom
    _save(Image.fromarray(tall), tmp_path / "src" / "tall.png", "PNG")
    ds = load_dataset(prepare_image_folder(source=tmp_path / "src", root=tmp_path / "c", image_size=10,
                                           storage="files"))
    assert list(ds.ids) == ["tall.png", "wide.png"]
    for row, source in ((1, pixels), (0, tall)):
        image = ds.read(row)
        assert image.dtype == torch.uint8 and image.shape == (3, 10, 10)
        hwc = image.permute(1, 2, 0).numpy().astype(int)
        assert hwc[3:7, 3:7].min() == 255  # the white square, scaled to the middle 5x5 (edges blend)
        blue = np.ones(hwc.shape[:2], dtype=bool)
        blue[2:8, 2:8] = False
        assert np.abs(hwc[blue] - (0, 0, 255)).max() <= 20  # blue around it: the strips were cut off (the
        # bicubic filter reaches 1-2 source pixels past the crop, hence the tolerance)
        img = Image.fromarray(source)
        w, h = img.size
        scale = 10 / min(w, h)
        big = img.resize((round(w * scale), round(h * scale)), Image.Resampling.BICUBIC)
        left, top = (big.size[0] - 10) // 2, (big.size[1] - 10) // 2
        two_step = np.asarray(big.crop((left, top, left + 10, top + 10)), dtype=int)
        assert np.abs(two_step - hwc).mean() < 12  # the same geometry as resize-shorter-side + centre crop
        assert np.array_equal(hwc, load_square_rgb(ds.file(row), size=10))  # exactly the memory storage's rule


def test_read_returns_none_for_unreadable_files(tmp_path):
    src = _class_folder(tmp_path / "src")
    broken = _add_broken(src)
    jpeg = io.BytesIO()
    _noise(5, (64, 48)).save(jpeg, format="JPEG")
    (src / "owls" / "truncated.jpg").write_bytes(jpeg.getvalue()[: len(jpeg.getvalue()) // 2])
    ds = load_dataset(_prepare(src, tmp_path / "c", "files"))
    assert len(ds) == 12  # unreadable files are only found when read: nothing was decoded to prepare
    rows = {i: r for r, i in enumerate(ds.ids)}
    for sample_id in [*broken, "owls/truncated.jpg"]:
        assert ds.read(rows[sample_id]) is None
        assert isinstance(ds.decode(rows[sample_id]), str)
    (src / "owls" / "02.png").unlink()  # deleted after indexing
    assert ds.read(rows["owls/02.png"]) is None
    grey = ds.read(rows["owls/00.png"])  # a grayscale PNG comes back as RGB
    assert grey.shape == (3, SIZE, SIZE) and torch.equal(grey[0], grey[1])


def test_get_batch_keeps_positions_and_blanks_unreadable_files(tmp_path, caplog):
    src = _class_folder(tmp_path / "src")
    _add_broken(src)
    ds = load_dataset(_prepare(src, tmp_path / "c", "files"))
    rows = {i: r for r, i in enumerate(ds.ids)}
    order = np.asarray([rows["dogs/01.jpg"], rows["cats/corrupt.png"], rows["cats/00.png"]])
    with caplog.at_level("WARNING"):
        batch = ds.get_batch(order)
    assert batch.shape == (3, 3, SIZE, SIZE) and batch.dtype == torch.uint8
    assert torch.equal(batch[0], ds.read(order[0])) and torch.equal(batch[2], ds.read(order[2]))
    assert int(batch[1].max()) == 0  # a black image keeps the position
    assert ds.skips.stats()["skipped_unreadable_image"] == 1 and ds.skips.good == 2
    assert "cats/corrupt.png" in caplog.text
    with pytest.raises(IndexError):
        ds.get_batch([len(ds)])


def test_the_dataset_pickles_for_worker_processes(tmp_path):
    ds = load_dataset(_prepare(_class_folder(tmp_path / "src"), tmp_path / "c", "files"))
    ds.get_batch(np.arange(4))  # starts the thread pool, which must not travel
    copy = pickle.loads(pickle.dumps(ds))
    assert torch.equal(copy.get_batch(np.arange(len(ds))), ds.get_batch(np.arange(len(ds))))
    assert copy.skips.seen == 9 and list(copy.ids) == list(ds.ids)


# ------------------------------------------------------------------------------------------ both storages agree
def test_both_storages_give_the_same_ids_labels_splits_and_pixels(tmp_path):
    src = _class_folder(tmp_path / "src", per_class=4)
    memory = load_dataset(_prepare(src, tmp_path / "c", "memory"))
    files = load_dataset(_prepare(src, tmp_path / "c", "files"))
    assert list(files.ids) == list(memory.ids) and files.ids[0] == "cats/00.png"
    assert np.array_equal(files.split, memory.split)
    assert files.class_names == memory.class_names == {"class": ["cats", "dogs", "owls"]}
    assert files.labels.keys() == memory.labels.keys()
    assert np.array_equal(files.labels["class"], memory.labels["class"])
    for split in ("train", "test", "all"):
        assert np.array_equal(files.indices(split), memory.indices(split))
    files.verify_ids(memory.ids[memory.indices("train")], split="train")
    order = np.random.default_rng(0).permutation(len(files))
    assert torch.equal(files.get_batch(order), memory.get_batch(order))  # bit-identical pixels
    batches = [order[:5], order[5:6], order[6:]]
    got = list(iter_batches(files, batches, workers=2, prefetch=2))
    want = list(iter_batches(memory, batches, workers=2, prefetch=2))
    assert all(np.array_equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, want))


def test_imagenet_layout_gives_split_and_class_from_folders(tmp_path):
    src = _imagenet_folder(tmp_path / "imagenet")
    datasets = [load_dataset(_prepare(src, tmp_path / "c", storage, split_from_folders=True))
                for storage in ("files", "memory")]
    files, memory = datasets
    assert type(files) is ImageFileDataset and type(memory) is ImageArrayDataset
    for ds in datasets:
        assert len(ds) == 12 and ds.ids[0] == "train/n01440764/n01440764_0.JPEG"
        assert ds.class_names == {"class": ["n01440764", "n01443537"]}  # one class list for train and val
        assert all(s == ("train" if i.startswith("train/") else "test") for i, s in zip(ds.ids, ds.split))
        assert len(ds.indices("train")) == 8 and len(ds.indices("test")) == 4
        assert all(ds.labels["class"][r] == int("n01443537" in i) for r, i in enumerate(ds.ids))
    assert np.array_equal(files.split, memory.split) and np.array_equal(files.labels["class"], memory.labels["class"])
    assert torch.equal(files.get_batch(np.arange(12)), memory.get_batch(np.arange(12)))
    # without split_from_folders the top folder is the class (today's rule) and the split is drawn at random
    plain = load_dataset(_prepare(src, tmp_path / "c", "files"))
    assert plain.class_names == {"class": ["train", "val"]} and len(plain.indices("test")) == 3

    _save(_noise(1, (20, 20)), src / "val" / "loose.JPEG", "JPEG")  # flat val/ file: split known, class not
    with pytest.warns(UserWarning, match=r"1 image\(s\) sit directly in a split folder"):
        flat = load_dataset(_prepare(src, tmp_path / "c", "files", split_from_folders=True))
    row = list(flat.ids).index("val/loose.JPEG")
    assert flat.split[row] == "test" and flat.labels["class"][row] == -1
    _save(_noise(2, (20, 20)), src / "extra" / "n01440764" / "x.JPEG", "JPEG")
    with pytest.raises(DataError, match=r"1 image\(s\).*not in a split folder.*'extra/n01440764/x.JPEG'"):
        _prepare(src, tmp_path / "c", "files", split_from_folders=True)


# ------------------------------------------------------------------------------------------ iter_batches
def test_iter_batches_with_workers_keeps_order_and_equals_in_process(tmp_path):
    src = _class_folder(tmp_path / "src", per_class=4)
    broken = _add_broken(src)
    ds = load_dataset(_prepare(src, tmp_path / "c", "files"))
    bad_rows = {int(np.flatnonzero(ds.ids == b)[0]) for b in broken}
    order = np.random.default_rng(1).permutation(len(ds))
    batches = [order[:4], order[4:5], np.asarray([], dtype=np.int64), order[5:11], order[11:]]
    runs = {}
    for workers in (0, 2):
        counter = SkipCounter(max_skip_fraction=0.5)
        runs[workers] = (list(iter_batches(ds, iter(batches), workers=workers, prefetch=2, counter=counter)),
                         counter.stats())
    out0, stats0 = runs[0]
    out2, stats2 = runs[2]
    assert len(out2) == len(batches)  # one result per batch, in the order given
    for (rows0, images0), (rows2, images2), batch in zip(out0, out2, batches):
        expected = np.asarray([r for r in batch if int(r) not in bad_rows], dtype=np.int64)
        assert np.array_equal(rows2, expected) and np.array_equal(rows0, expected)
        assert images2.dtype == torch.uint8 and images2.shape == (len(expected), 3, SIZE, SIZE)
        assert torch.equal(images0, images2)
        for row, image in zip(rows2, images2):
            assert torch.equal(image, ds.read(int(row)))
    assert stats0 == stats2 == {"good": 12, "skipped": 2, "seen": 14, "skip_fraction": 2 / 14,
                                "skipped_unreadable_image": 2}


def test_too_many_unreadable_files_raise_naming_them(tmp_path, caplog):
    src = _class_folder(tmp_path / "src")
    _add_broken(src)
    ds = load_dataset(_prepare(src, tmp_path / "c", "files"))
    batches = [np.arange(0, 6), np.arange(6, 11)]
    yielded = []
    with caplog.at_level("WARNING"), pytest.raises(DataError) as raised:
        for rows, images in iter_batches(ds, batches, workers=2, prefetch=1):  # default max_skip_fraction 0.01
            yielded.append(rows)
    message = str(raised.value)
    assert "2 of 11 samples are broken" in message and "unreadable_image" in message
    assert "cats/corrupt.png" in message and "dogs/empty.jpg" in message and str(ds.source) in message
    assert "data.image_folder.max_skip_fraction" in message and "re-export" in message
    assert len(yielded) == 2 and sum(map(len, yielded)) == 9  # every batch came through before the verdict
    assert "skipped sample cats/corrupt.png" in caplog.text
    assert len(list(iter_batches(ds, batches, workers=0, prefetch=1, max_skip_fraction=0.2))) == 2


def test_iter_batches_slices_the_image_array_in_process(tmp_path, monkeypatch):
    memory = load_dataset(_prepare(_class_folder(tmp_path / "src"), tmp_path / "c", "memory"))

    def no_loader(*args, **kwargs):
        raise AssertionError("the images.npy fast path must not start a DataLoader")

    from contrastive.data import workers as worker_pool
    monkeypatch.setattr(worker_pool, "DataLoader", no_loader)
    batches = [np.asarray([8, 0, 3]), np.asarray([1])]
    out = list(iter_batches(memory, (b for b in batches), workers=4, prefetch=2))
    assert [r.tolist() for r, _ in out] == [[8, 0, 3], [1]]
    assert torch.equal(out[0][1], memory.get_batch([8, 0, 3]))
    with pytest.raises(ConfigError, match="workers >= 0"):
        list(iter_batches(memory, batches, workers=-1, prefetch=2))
    with pytest.raises(IndexError):
        list(iter_batches(memory, [np.asarray([99])], workers=0, prefetch=1))


# ------------------------------------------------------------------------------------------ skip counter, config
def test_one_skip_counter_serves_shards_and_image_files():
    assert clip_data.SkipCounter is SkipCounter
    counter = SkipCounter(max_skip_fraction=0.001, where="test", fix="do the thing")
    counter.skip(reason="unreadable_image", key="a/b.png", url="/images", detail="OSError: truncated")
    counter.ok(500)  # batch counts: no check before 1000 samples
    with pytest.raises(DataError, match=r"test: 2 of 1001 samples.*a/b.png in /images.*do the thing"):
        counter.skip(reason="unreadable_image", key="a/c.png", url="/images")
        counter.ok(499)  # crosses 1000 seen: the fraction (2/1001 > 0.1 %) is checked mid-stream
    lenient = SkipCounter(max_skip_fraction=0.01)
    lenient.skip(reason="bad_image", key="000001", url="shard.tar")
    lenient.ok(999)  # 1 of 1000: within 1 %, no error
    assert lenient.stats()["seen"] == 1000
    with pytest.raises(ConfigError):
        SkipCounter(max_skip_fraction=1.5)


def test_config_storage_keys():
    folder = ImageFolderConfig()
    assert folder.storage == "memory" and folder.split_from_folders is False and folder.max_skip_fraction == 0.01
    data = DataConfig(kind="image_folder", image_folder={"source": "/x", "storage": "files",
                                                         "split_from_folders": True})
    assert data.image_folder.storage == "files"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="storage"):
            ImageFolderConfig(storage="disk")
        with pytest.raises(ValueError, match="max_skip_fraction"):
            ImageFolderConfig(max_skip_fraction=2.0)


# ------------------------------------------------------------------------------------------ reduced-size decoding
def _photo_jpeg(path, *, size=(80, 60), exif_orientation: int | None = None):
    """A smooth JPEG (a bicubic blow-up of 4x3 random colours): resampling it differently moves pixels a little."""
    rng = np.random.default_rng(3)
    image = Image.fromarray(rng.integers(0, 256, (3, 4, 3), dtype=np.uint8)).resize(size, Image.Resampling.BICUBIC)
    path.parent.mkdir(parents=True, exist_ok=True)
    exif = Image.Exif()
    if exif_orientation is not None:
        exif[0x0112] = exif_orientation
    image.save(path, format="JPEG", quality=92, exif=exif.tobytes())
    return path


def _decoded_shapes(monkeypatch) -> list:
    """The shapes simplejpeg decodes from now on, recorded."""
    import simplejpeg

    shapes, decode = [], simplejpeg.decode_jpeg
    monkeypatch.setattr(simplejpeg, "decode_jpeg", lambda *a, **k: shapes.append(decode(*a, **k).shape) or
                        decode(*a, **k))
    return shapes


def test_auto_decodes_jpegs_at_a_power_of_two_scale_close_to_full(tmp_path, monkeypatch):
    """decode_scale="auto": libjpeg-turbo decodes an 80x60 JPEG for a 16 px square at 1/2 (40x30: the smallest of
    1, 1/2, 1/4, 1/8 whose shorter side is >= 16; 3/8 would be smaller but is not one of its fast scales), then
    the centre square is resampled; the pixels stay within a mean of 3 levels (max 24) of full-size decoding, and
    are the same on every call and from a file object."""
    path = _photo_jpeg(tmp_path / "a.jpg")
    shapes = _decoded_shapes(monkeypatch)
    auto = load_square_rgb(path, size=16, decode_scale="auto")
    assert shapes == [(30, 40, 3)]
    full = load_square_rgb(path, size=16, decode_scale="full")
    assert auto.shape == full.shape == (16, 16, 3) and auto.dtype == np.uint8
    diff = np.abs(auto.astype(int) - full)
    assert diff.mean() < 3 and diff.max() <= 24
    assert np.array_equal(auto, load_square_rgb(path, size=16, decode_scale="auto"))  # keyed by the file alone
    with open(path, "rb") as handle:  # a file object (a shard member) decodes the same
        assert np.array_equal(auto, load_square_rgb(io.BytesIO(handle.read()), size=16, decode_scale="auto"))


def test_auto_at_full_scale_gives_full_s_pixels_to_rounding(tmp_path, monkeypatch):
    """Where no fast scale keeps the square (80x60 at 40 px: 1/2 would leave 30), "auto" decodes the whole image
    and torch's antialiased bicubic equals PIL's bicubic (both Keys' a = -0.5 with the same support) to one level."""
    path = _photo_jpeg(tmp_path / "a.jpg")
    shapes = _decoded_shapes(monkeypatch)
    auto = load_square_rgb(path, size=40, decode_scale="auto")
    assert shapes == [(60, 80, 3)]
    diff = np.abs(auto.astype(int) - load_square_rgb(path, size=40, decode_scale="full"))
    assert diff.max() <= 1 and diff.mean() < 0.1


@pytest.mark.parametrize("size", [(80, 60), (60, 80)], ids=["landscape", "portrait"])
def test_auto_returns_the_resampled_square_without_a_transposing_copy(tmp_path, monkeypatch, size):
    """The (S, S, 3) array "auto" returns is the resampling's own output, for landscape and portrait photos alike:
    a portrait square that reaches torch as channels-first comes back channels-first and needs a transposing copy
    (a sixth of an image's decoding time at 224 px)."""
    path = _photo_jpeg(tmp_path / "a.jpg", size=size)
    outputs, interpolate = [], torch.nn.functional.interpolate
    monkeypatch.setattr(torch.nn.functional, "interpolate", lambda *a, **k: outputs.append(interpolate(*a, **k))
                        or outputs[-1])
    square = load_square_rgb(path, size=16, decode_scale="auto")
    assert len(outputs) == 1 and square.shape == (16, 16, 3)
    assert np.shares_memory(square, outputs[0].numpy())


@pytest.mark.parametrize("orientation", range(1, 9))
def test_auto_follows_every_exif_orientation(tmp_path, orientation):
    """Each of EXIF's 8 orientations gives the picture PIL's exif_transpose shows ("full"); a missed or wrong
    transpose or flip moves whole colour regions (checked against every other orientation's result)."""
    path = _photo_jpeg(tmp_path / "r.jpg", size=(80, 48), exif_orientation=orientation)
    auto = load_square_rgb(path, size=16, decode_scale="auto")
    full = load_square_rgb(path, size=16, decode_scale="full")
    near = np.abs(auto.astype(int) - full).mean()
    assert near < 1.5
    for other in set(range(1, 9)) - {orientation}:
        shown = load_square_rgb(_photo_jpeg(tmp_path / f"o{other}.jpg", size=(80, 48), exif_orientation=other),
                                size=16, decode_scale="full")
        if not np.array_equal(shown, full):  # 80x48 -> its centre square: some orientations show the same square
            assert np.abs(auto.astype(int) - shown).mean() > 3 * near


def test_auto_leaves_other_formats_and_cmyk_to_pil(tmp_path):
    png = tmp_path / "p.png"
    _save(_noise(0, (30, 20)), png, "PNG")
    assert np.array_equal(load_square_rgb(png, size=12, decode_scale="auto"),
                          load_square_rgb(png, size=12, decode_scale="full"))
    cmyk = tmp_path / "c.jpg"
    Image.open(_photo_jpeg(tmp_path / "a.jpg")).convert("CMYK").save(cmyk, format="JPEG")
    assert np.array_equal(load_square_rgb(cmyk, size=12, decode_scale="auto"),
                          load_square_rgb(cmyk, size=12, decode_scale="full"))
    gray = tmp_path / "g.jpg"
    Image.open(_photo_jpeg(tmp_path / "b.jpg")).convert("L").save(gray, format="JPEG")
    auto = load_square_rgb(gray, size=40, decode_scale="auto")
    assert auto.shape == (40, 40, 3) and np.abs(auto.astype(int) - load_square_rgb(gray, size=40)).max() <= 1


def test_decode_scale_is_part_of_the_dataset_key_and_both_storages_agree(tmp_path, monkeypatch):
    src = tmp_path / "src"
    for i in range(3):
        _photo_jpeg(src / "c" / f"{i}.jpg", size=(80 + 8 * i, 60))
    full = load_dataset(_prepare(src, tmp_path / "c", "files"))
    auto_files = load_dataset(_prepare(src, tmp_path / "c", "files", decode_scale="auto"))
    auto_memory = load_dataset(_prepare(src, tmp_path / "c", "memory", decode_scale="auto"))
    assert full.path != auto_files.path and full.digest != auto_files.digest
    with monkeypatch.context() as patched:  # a new revision of the "auto" decoder prepares anew
        patched.setattr(image_folder, "AUTO_DECODER", image_folder.AUTO_DECODER + 1)
        assert _prepare(src, tmp_path / "c", "files", decode_scale="auto") != auto_files.path
    assert full.decode_scale == "full" and auto_files.decode_scale == "auto"
    rows = np.arange(3)
    assert torch.equal(auto_files.get_batch(rows), auto_memory.get_batch(rows))
    assert not torch.equal(auto_files.get_batch(rows), full.get_batch(rows))
    with pytest.raises(ConfigError, match="decode_scale"):
        _prepare(src, tmp_path / "c", "files", decode_scale="half")


def test_the_exif_segment_is_found_by_walking_the_header(tmp_path):
    """The EXIF check walks the JPEG's header segments: found after the JFIF segment and beside an ICC profile,
    not found without one, and a header cut short is "no EXIF" (the decoder then reports the damage), never an
    exception."""
    from PIL import ImageCms

    buffer = io.BytesIO()
    Image.open(_photo_jpeg(tmp_path / "a.jpg")).save(buffer, format="JPEG")  # no exif= : no EXIF segment
    plain = buffer.getvalue()
    tagged = _photo_jpeg(tmp_path / "b.jpg", exif_orientation=6).read_bytes()
    assert not image_decode._has_exif_segment(plain) and image_decode._has_exif_segment(tagged)
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    exif = Image.Exif()
    exif[0x0112] = 3
    with_icc = io.BytesIO()
    Image.open(io.BytesIO(plain)).save(with_icc, format="JPEG", icc_profile=icc, exif=exif.tobytes())
    assert image_decode._has_exif_segment(with_icc.getvalue())
    assert image_decode._jpeg_orientation(with_icc.getvalue()) == 3
    assert not image_decode._has_exif_segment(tagged[:5]) and not image_decode._has_exif_segment(b"\xff\xd8")
