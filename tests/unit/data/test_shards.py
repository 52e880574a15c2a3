"""Webdataset shards as a row-indexed dataset (storage "shards"): the index, decoding, the batch reader, the config."""
from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

from contrastive.modalities.image import steps as stages
from contrastive.data.image_files import ImageFileDataset, IndexedImageDataset
from contrastive.data.image_decode import load_square_rgb
from contrastive.modalities.image.datasets.image_folder import prepare_image_folder
from contrastive.data.loading import iter_batches, load_dataset
from contrastive.data.shards import ShardDataset, prepare_shards
from contrastive.data.skips import SkipCounter
from contrastive.errors import ConfigError, DataError
from contrastive.modalities.image.config import DataConfig, ImagePipelineConfig, ShardsConfig, preflight
from tests.faults.train_tiny_stage import tiny_spec

SIZE = 16
WNIDS = ("n01440764", "n01443537", "n01484850")  # cls 0, 1, 2 (ImageNet-wds: the class index as text)
PNG_MAGIC = b"\x89PNG"
CORRUPT_KEY = "n01443537_0001"  # train-0, second sample: cls 1


def _noise_image(seed: int, size: tuple[int, int], fmt: str = "JPEG") -> bytes:
    """A random non-square picture (width, height), encoded: a wrong crop or resize changes its pixels."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def _write_shards(directory, *, train_shards: int = 2, per_shard: int = 12, test_samples: int = 6,
                  side: int = 0) -> dict:
    """ImageNet-wds / img2dataset-style shards written with webdataset.TarWriter: train-{i}.tar and val-0.tar.

    Each sample: ``__key__``, ``jpg``, ``cls`` (int), ``json`` (img2dataset fields + "photographer"). The second
    sample of train-0 has a truncated JPEG; one test sample is a PNG, one has no photographer; one train sample has
    no image at all (not indexed). ``side`` > 0 makes every image side x side (else non-square, varying).
    Returns {"train", "test": shard paths, "images": key -> encoded bytes, "samples": key -> (split, cls, who)}.
    """
    directory.mkdir(parents=True, exist_ok=True)
    record = {"train": [], "test": [], "images": {}, "samples": {}}
    for split, count, shard_count in (("train", per_shard, train_shards), ("test", test_samples, 1)):
        for shard in range(shard_count):
            path = directory / (f"train-{shard}.tar" if split == "train" else "val-0.tar")
            record[split].append(str(path))
            with wds.TarWriter(str(path)) as writer:
                for i in range(count):
                    number = shard * per_shard + i
                    cls = (number + (split == "test")) % 3
                    key = f"{WNIDS[cls]}_{number:04d}" if split == "train" else f"ILSVRC2012_val_{i:08d}"
                    size = (side, side) if side else (20 + number % 7, 14 + 3 * (number % 3))
                    fmt = "PNG" if (split, i) == ("test", 2) else "JPEG"
                    image = _noise_image(1000 * (split == "test") + number, size, fmt)
                    if key == CORRUPT_KEY:
                        image = image[: len(image) // 2]
                    who = None if (split, i) == ("test", 4) else ("bob", "alice")[number % 2]
                    meta = {"key": key, "status": "success", "caption": f"photo {number}", "width": size[0],
                            **({"photographer": who} if who else {})}
                    sample = {"__key__": key, "png" if fmt == "PNG" else "jpg": image, "cls": cls, "json": meta}
                    writer.write(sample)
                    record["images"][key] = image
                    record["samples"][key] = (split, cls, who)
                if split == "train" and shard == 0:  # a sample without an image: not indexed, counted
                    writer.write({"__key__": "no_image_sample", "cls": 0, "json": {"key": "x"}})
    return record


def _prepare(tmp_path, shards: dict, **kwargs):
    kwargs = {"image_size": SIZE, "label_fields": ["photographer"], "max_skip_fraction": 0.1, **kwargs}
    return prepare_shards(train_urls=shards["train"], test_urls=shards["test"], root=tmp_path / "cache", **kwargs)


def _dir_bytes(path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------ the index
def test_the_index_holds_no_pixels_and_gets_ids_labels_and_splits(tmp_path):
    shards = _write_shards(tmp_path / "shards")
    path = _prepare(tmp_path, shards)
    assert sorted(p.name for p in path.iterdir()) == ["index.npz", "manifest.json"]
    ds = load_dataset(path, verify_digest=True)
    samples = shards["samples"]
    assert list(ds.ids) == list(samples)  # __key__, train shards then the test shard, in tar order
    assert "no_image_sample" not in set(ds.ids) and len(ds) == 30
    assert list(ds.split) == [samples[k][0] for k in ds.ids]
    assert len(ds.indices("train")) == 24 and len(ds.indices("test")) == 6
    # cls -> "class" (numeric order: the dense index is the cls value), json "photographer" -> text order, -1 unknown
    assert ds.class_names == {"class": ["0", "1", "2"], "photographer": ["alice", "bob"]}
    assert ds.labels["class"].tolist() == [samples[k][1] for k in ds.ids]
    who = [samples[k][2] for k in ds.ids]
    assert ds.labels["photographer"].tolist() == [-1 if w is None else ["alice", "bob"].index(w) for w in who]
    manifest = ds.manifest
    assert manifest["storage"] == "shards" and manifest["image_size"] == SIZE and manifest["id_scheme"] == "key"
    assert [s["url"] for s in manifest["shards"]] == [str(p) for p in shards["train"] + shards["test"]]
    assert [s["num_samples"] for s in manifest["shards"]] == [12, 12, 6]
    assert manifest["skipped"]["skipped_no_image"] == 1  # counted while indexing
    assert _prepare(tmp_path, shards) == path  # the same shards: the index is reused

    # O(N) bytes: 8x larger images (64x more pixels) give an index of the same size
    small = _dir_bytes(_prepare(tmp_path / "s", _write_shards(tmp_path / "small", side=16)))
    large = _dir_bytes(_prepare(tmp_path / "l", _write_shards(tmp_path / "large", side=128)))
    assert abs(large - small) < 64 and large < sum(map(len, shards["images"].values()))

    os.utime(shards["test"][0], ns=(1, 1))  # a re-downloaded shard (new mtime): indexed anew, new digest
    again = _prepare(tmp_path, shards)
    assert again != path and load_dataset(again).digest != ds.digest


def test_keys_shared_by_train_and_test_shards_become_split_prefixed(tmp_path):
    """Two img2dataset downloads both number their keys from 000000000."""
    for split in ("train", "test"):
        with wds.TarWriter(str(tmp_path / f"{split}.tar")) as writer:
            for i in range(3):
                writer.write({"__key__": f"{i:09d}", "jpg": _noise_image(i, (20, 16)), "cls": i % 2})
    ds = load_dataset(prepare_shards(train_urls=str(tmp_path / "train.tar"), test_urls=[str(tmp_path / "test.tar")],
                                     root=tmp_path / "cache", image_size=SIZE, label_fields=[]))
    assert ds.ids.tolist()[2:4] == ["train/000000002", "test/000000000"] and ds.manifest["id_scheme"] == "split/key"
    with pytest.raises(DataError, match="occurs twice among the train shards"):
        prepare_shards(train_urls=[str(tmp_path / "train.tar"), str(tmp_path / "test.tar")], test_urls=None,
                       root=tmp_path / "cache", image_size=SIZE)


def test_labels_from_json_alone_and_conflicting_or_compressed_shards(tmp_path):
    """img2dataset shards carry no cls: a json key can be the attribute "class" (a year is ordered as a number)."""
    with wds.TarWriter(str(tmp_path / "cc.tar")) as writer:
        for i in range(4):
            meta = {"class": ["owl", "cat"][i % 2], "year": [2010, 9, 2010, 10][i], "caption": "x"}
            writer.write({"__key__": f"{i:09d}", "jpg": _noise_image(i, (18, 18)), "json": meta, "txt": "x"})
    ds = load_dataset(prepare_shards(train_urls=str(tmp_path / "cc.tar"), test_urls=None, root=tmp_path / "c",
                                     image_size=SIZE, label_fields=["class", "year"]))
    assert ds.class_names == {"class": ["cat", "owl"], "year": ["9", "10", "2010"]}
    assert ds.labels["class"].tolist() == [1, 0, 1, 0] and ds.labels["year"].tolist() == [2, 0, 2, 1]
    assert len(ds.indices("test")) == 0
    shards = _write_shards(tmp_path / "shards", train_shards=1)
    with pytest.raises(ConfigError, match="cls members already give attribute 'class'"):
        _prepare(tmp_path, shards, label_fields=["class"])
    (tmp_path / "cc.tar.gz").write_bytes(b"")
    with pytest.raises(ConfigError, match="compressed shards.*plain .tar"):
        prepare_shards(train_urls=str(tmp_path / "cc.tar.gz"), test_urls=None, root=tmp_path / "c", image_size=SIZE)


# ------------------------------------------------------------------------------------------ decoding
def test_read_equals_the_image_folder_rule_and_is_none_for_the_corrupt_sample(tmp_path):
    shards = _write_shards(tmp_path / "shards")
    ds = load_dataset(_prepare(tmp_path, shards))
    folder = tmp_path / "folder"  # the same encoded images as files, read by the image-folder storage
    for key, image in shards["images"].items():
        (folder / key[:2]).mkdir(parents=True, exist_ok=True)
        ext = "png" if image.startswith(PNG_MAGIC) else "jpg"
        (folder / key[:2] / f"{key}.{ext}").write_bytes(image)
    files = load_dataset(prepare_image_folder(source=folder, root=tmp_path / "c", image_size=SIZE, storage="files"))
    file_rows = {i.split("/")[1].rsplit(".", 1)[0]: r for r, i in enumerate(files.ids)}
    for row, key in enumerate(ds.ids):
        image = ds.read(row)
        if key == CORRUPT_KEY:
            assert image is None and isinstance(ds.decode(row), str)
            continue
        assert image.dtype == torch.uint8 and image.shape == (3, SIZE, SIZE)
        hwc = image.permute(1, 2, 0).numpy()
        assert np.array_equal(hwc, load_square_rgb(io.BytesIO(shards["images"][key]), size=SIZE))
        assert torch.equal(image, files.read(file_rows[key]))  # bit-identical to the image folder's pixels
    shard, offset, nbytes = ds.location(1)
    assert shard == shards["train"][0] and nbytes == len(shards["images"][ds.ids[1]])
    with open(shard, "rb") as handle:
        handle.seek(offset)
        assert handle.read(nbytes) == shards["images"][ds.ids[1]]  # the recorded byte range is the member

    batch = ds.get_batch([2, 1, 0])  # get_batch keeps positions: the corrupt one is black and counted
    assert torch.equal(batch[0], ds.read(2)) and int(batch[1].max()) == 0
    assert ds.skips.stats()["skipped_unreadable_image"] == 1
    copy = pickle.loads(pickle.dumps(ds))  # open tar files and threads stay behind; reopened lazily
    assert torch.equal(copy.get_batch(np.arange(len(ds))), ds.get_batch(np.arange(len(ds))))
    assert copy.skips.seen == len(ds)


# ------------------------------------------------------------------------------------------ iter_batches
def test_iter_batches_with_workers_equals_in_process_and_skips_the_corrupt_sample(tmp_path):
    ds = load_dataset(_prepare(tmp_path, _write_shards(tmp_path / "shards")))
    bad_row = int(np.flatnonzero(ds.ids == CORRUPT_KEY)[0])
    order = np.random.default_rng(3).permutation(len(ds))
    batches = [order[:7], order[7:8], np.asarray([], dtype=np.int64), order[8:20], order[20:]]
    runs = {}
    for workers in (0, 2):
        counter = SkipCounter(max_skip_fraction=0.5)
        runs[workers] = (list(iter_batches(ds, iter(batches), workers=workers, prefetch=2, counter=counter)),
                         counter.stats())
    (out0, stats0), (out2, stats2) = runs[0], runs[2]
    assert len(out0) == len(out2) == len(batches)  # one result per batch, in the order given
    for (rows0, images0), (rows2, images2), batch in zip(out0, out2, batches):
        expected = np.asarray([r for r in batch if r != bad_row], dtype=np.int64)
        assert np.array_equal(rows0, expected) and np.array_equal(rows2, expected)
        assert images2.shape == (len(expected), 3, SIZE, SIZE) and torch.equal(images0, images2)
        for row, image in zip(rows2, images2):
            assert torch.equal(image, ds.read(int(row)))
    assert stats0 == stats2 == {"good": 29, "skipped": 1, "seen": 30, "skip_fraction": 1 / 30,
                                "skipped_unreadable_image": 1}
    # without a counter the threshold is the one prepare_shards recorded (0.1 here; 1 / 30 passes) ...
    assert sum(len(r) for r, _ in iter_batches(ds, batches, workers=0)) == 29
    # ... and an explicit one overrides it; the error names the sample, its shard and the config key
    with pytest.raises(DataError, match=rf"1 of 30 samples are broken.*{CORRUPT_KEY} in .*train-0.tar.*"
                                        r"data.shards.max_skip_fraction"):
        list(iter_batches(ds, batches, workers=2, max_skip_fraction=0.01))


# ------------------------------------------------------------------------------------------ load_dataset, errors
def test_load_dataset_picks_the_shard_class(tmp_path):
    path = _prepare(tmp_path, _write_shards(tmp_path / "shards"))
    ds = load_dataset(path)
    assert type(ds) is ShardDataset and isinstance(ds, IndexedImageDataset)
    assert not issubclass(ShardDataset, ImageFileDataset)  # siblings sharing a base, not a file dataset
    assert ds.max_skip_fraction == 0.1 and load_dataset(path, max_skip_fraction=0.3).max_skip_fraction == 0.3
    assert "ShardDataset" in repr(ds) and "3 shards" in repr(ds)


def test_a_missing_shard_raises_naming_it(tmp_path):
    shards = _write_shards(tmp_path / "shards")
    pattern = str(tmp_path / "shards" / "train-{0..2}.tar")  # train-2.tar does not exist
    with pytest.raises(DataError, match=r"1 of 3 shards of data.shards.train_urls do not exist \(e.g. .*train-2.tar\)"):
        prepare_shards(train_urls=pattern, test_urls=shards["test"], root=tmp_path / "cache", image_size=SIZE)
    with pytest.raises(ConfigError, match="remote"):
        prepare_shards(train_urls="https://host/train-0.tar", test_urls=None, root=tmp_path / "cache",
                       image_size=SIZE)
    with pytest.raises(DataError, match=r"label field\(s\) \['photographr'\] are in no sample's json"):
        _prepare(tmp_path, shards, label_fields=["photographr"])
    path = _prepare(tmp_path, {"train": str(tmp_path / "shards" / "train-{0..1}.tar"), "test": shards["test"]})
    os.utime(shards["train"][1], ns=(5, 5))
    with pytest.raises(DataError, match=r"train-1.tar changed after dataset"):
        load_dataset(path)
    os.remove(shards["test"][0])
    with pytest.raises(DataError, match=r"shard .*val-0.tar that dataset .* no longer exists.*data.shards.test_urls"):
        load_dataset(path)


def test_too_many_broken_samples_while_indexing_fail(tmp_path):
    shards = _write_shards(tmp_path / "shards", train_shards=1, per_shard=20)
    with pytest.raises(DataError, match=r"indexing 2 shards: 1 of 27 samples are broken.*no_image_sample"):
        _prepare(tmp_path, shards, max_skip_fraction=0.01)


# ------------------------------------------------------------------------------------------ config
def test_config_shards_section(tmp_path):
    shards = _write_shards(tmp_path / "shards")
    data = DataConfig(kind="shards", shards={"train_urls": str(tmp_path / "shards" / "train-{0..1}.tar"),
                                             "test_urls": shards["test"], "label_fields": ["photographer"]})
    assert data.shards.image_size == 32 and data.shards.max_skip_fraction == 0.01
    assert "shards" in data.content() and "shards" not in DataConfig().content()  # other kinds keep their hash
    with pytest.raises(ValueError, match="data.kind is shards but data.shards.test_urls is not set"):
        DataConfig(kind="shards", shards={"train_urls": shards["train"]})
    with pytest.raises(ValueError, match="remote.*download them"):
        ShardsConfig(train_urls="s3://bucket/train-{0..9}.tar")
    with pytest.raises(ValueError, match="label_fields lists a field twice"):
        ShardsConfig(label_fields=["a", "a"])
    missing_one = str(tmp_path / "shards" / "train-{0..2}.tar")
    config = ImagePipelineConfig(data={"kind": "shards", "shards": {"train_urls": missing_one, "test_urls": shards["test"]}})
    with pytest.raises(DataError, match=r"shards of data.shards.train_urls do not exist \(e.g. .*train-2.tar\): fix"):
        preflight(config)
    config.data.shards.train_urls = shards["train"]
    preflight(config)  # every shard exists


# ------------------------------------------------------------------------------------------ end to end
def test_a_stage_trains_and_exports_from_shards(tmp_path):
    """The library's stage functions on a shard dataset: 1 epoch in DataLoader workers, then every sample exported
    (the corrupt one with a zero embedding, counted)."""
    ds = load_dataset(_prepare(tmp_path, _write_shards(tmp_path / "shards")))
    spec = dataclasses.replace(tiny_spec(ds.path, tmp_path / "stage", epochs=1), workers=2)
    summary = stages.train_stage(spec)
    assert (tmp_path / "stage" / "model" / "model.pt").is_file() and summary["epochs"] == 1 and summary["steps"] >= 1
    exported = stages.export_stage_embeddings(dataset_dir=ds.path, model_path=tmp_path / "stage" / "model" / "model.pt",
                                              out_dir=tmp_path / "embeddings", batch_size=8, device="cpu", workers=0)
    assert exported["num_samples"] == len(ds) == 30 and exported["unreadable"] == 1
    manifest = json.loads((tmp_path / "embeddings" / "manifest.json").read_text())
    assert manifest["num_samples"] == 30
