"""ImageNet and ImageNet-100 from class folders, nothing downloaded:

    <root>/train/<wnid>/*.JPEG      (the ILSVRC-2012 train tar, each class tar extracted into its folder)
    <root>/val/<wnid>/*.JPEG        (the 50 000 validation images moved into class folders, e.g. with
                                     the common valprep.sh, as torchvision.datasets.ImageFolder expects)

ImageNet-100 (Tian et al., 2019, CMC) is the 100 classes listed in a text file, one WordNet id per line (the common
``imagenet100.txt``); ``class_list`` selects them. Only an index is written (ids = paths relative to ``root``,
split from the top folder, attribute ``class`` = the wnid, in sorted order): the images are decoded when read
(:class:`contrastive.data.image_files.ImageFileDataset`, storage "files"), so the dataset costs O(N) bytes.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from contrastive.data.dataset import INDEX_FILE, MANIFEST_FILE, _build_index, _write_json_atomic, atomic_dataset_dir, \
    is_index_prepared, params_hash, save_index
from contrastive.data.image_decode import IMAGE_EXTENSIONS, _files_fingerprint, file_index_digest
from contrastive.modalities.image.datasets.sources import missing_data
from contrastive.errors import ConfigError, DataError

KIND = "imagenet"
FORMAT_VERSION = 1
SPLIT_DIRS = {"train": "train", "val": "test"}
IMAGENET_URL = ("https://image-net.org/download-images (ILSVRC2012 train and val tars; put the val images into "
                "class folders with valprep.sh)")


def read_class_list(path: Path) -> list[str]:
    """WordNet ids, one per line (blank lines and '#' comments skipped; a second column is ignored), in file order."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"data.imagenet.class_list {path} does not exist: give the ImageNet-100 class list (one "
                          "wnid such as n01558993 per line), or unset it for all classes")
    wnids = [line.split()[0] for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    if len(set(wnids)) != len(wnids):
        raise ConfigError(f"{path} lists a class twice: keep one line per wnid")
    return wnids


def _list_class(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if not n.startswith(".") and n.lower().endswith(IMAGE_EXTENSIONS))


def list_images(root: Path, *, classes: list[str] | None) -> tuple[list[str], list[str]]:
    """(relative paths sorted by split, class, file; the sorted class names). DataError for a missing layout."""
    root = Path(root).expanduser()
    missing = [d for d in SPLIT_DIRS if not (root / d).is_dir()]
    if missing:
        raise missing_data(what="ImageNet", path=root, get_from=IMAGENET_URL, key="data.imagenet.root",
                           expected=f"train/<wnid>/*.JPEG and val/<wnid>/*.JPEG (missing {', '.join(missing)}/)")
    available = sorted(d for d in os.listdir(root / "train") if (root / "train" / d).is_dir())
    wanted = sorted(classes) if classes is not None else available
    absent = [c for c in wanted if c not in available or not (root / "val" / c).is_dir()]
    if absent:
        raise DataError(f"{len(absent)} class(es) have no train/ and val/ folder under {root} (e.g. {absent[:3]}): "
                        "check data.imagenet.class_list against the folder names, and that the val images are in "
                        "class folders (valprep.sh)")
    rel = [f"{top}/{c}/{name}" for top in SPLIT_DIRS for c in wanted for name in _list_class(root / top / c)]
    if not rel:
        raise missing_data(what="ImageNet images", path=root, get_from=IMAGENET_URL, key="data.imagenet.root",
                           expected="JPEG files in train/<wnid>/ and val/<wnid>/")
    return rel, wanted


def prepare_imagenet(*, source: Path, root: Path, image_size: int = 224, class_list: Path | None = None) -> Path:
    """Write (or reuse) the file index of ImageNet (all classes) or of the classes in ``class_list``.

    Returns:
        The dataset directory, opened by :func:`contrastive.data.loading.load_dataset` as an ImageFileDataset.
    """
    source = Path(source).expanduser()
    classes = read_class_list(class_list) if class_list is not None else None
    rel, names = list_images(source, classes=classes)
    params = {"format_version": FORMAT_VERSION, "source": str(source.resolve()), "image_size": int(image_size),
              "classes": names if classes is not None else "all", "num_files": len(rel),
              "files_sha256": _files_fingerprint(source, rel)}
    target = Path(root) / f"{KIND}-{params_hash(params)}"

    def prepared(t: Path) -> bool:
        return is_index_prepared(t, params=params, storage="files", kind=KIND)

    if prepared(target):
        return target
    lookup = {c: i for i, c in enumerate(names)}
    split = np.asarray([SPLIT_DIRS[r.split("/", 1)[0]] for r in rel])
    labels = {"class": np.asarray([lookup[r.split("/")[1]] for r in rel], dtype=np.int64)}
    index = _build_index(ids=rel, split=split, labels=labels, attributes={"class": names}, num_samples=len(rel))
    with atomic_dataset_dir(target, keep_existing=prepared) as tmp:
        save_index(tmp / INDEX_FILE, index)
        _write_json_atomic(tmp / MANIFEST_FILE, {
            "kind": KIND, "storage": "files", "source": str(source.resolve()), "num_samples": len(rel),
            "num_train": int(np.count_nonzero(split == "train")), "num_test": int(np.count_nonzero(split == "test")),
            "image_size": int(image_size), "attributes": {"class": names},
            "params": json.loads(json.dumps(params)), "digest": file_index_digest(index=index, params=params)})
    return target
