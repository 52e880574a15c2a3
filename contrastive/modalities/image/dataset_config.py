"""Config sections of the standard datasets read from their on-disk layouts (``data.kind`` cifar_mnist, celeba,
stl10, imagenet, trifeature_paper), the one place that prepares them, and their checks before any compute.

``DataConfig`` (schema.py) holds one section per kind; :func:`dataset_content` leaves these sections out of the
data section's content key unless their kind is selected, so configs of the older kinds keep their keys.
docs/datasets.md documents every key.
"""
from __future__ import annotations

from pathlib import Path
from pydantic import BaseModel, ConfigDict, Field

from contrastive.errors import ConfigError

# data.kind -> the DataConfig section of that kind (same name).
KINDS = ("cifar_mnist", "celeba", "stl10", "imagenet", "trifeature_paper")
# The section keys that must name a folder for each kind (checked before any compute).
SOURCE_KEYS = {"cifar_mnist": ("cifar_root", "mnist_root"), "celeba": ("root",), "stl10": ("root",),
               "imagenet": ("root",), "trifeature_paper": ()}
# The model.in_channels each kind's images have.
CHANNELS = {"cifar_mnist": 4}


class _Dataset(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def content(self) -> dict:
        return self.model_dump(mode="json")


class CifarMnistConfig(_Dataset):
    """CIFAR-10 + MNIST concatenated channel-wise (4 channels, 32 px; set model.in_channels=4)."""
    cifar_root: Path | None = Field(None, description="folder holding torchvision's cifar-10-batches-py/")
    mnist_root: Path | None = Field(None, description="folder holding torchvision's MNIST/raw/ (*-ubyte files)")
    num_train: int | None = Field(None, ge=16, description="seeded subset of the 50 000 training images; None = all")
    num_test: int | None = Field(None, ge=16, description="seeded subset of the 10 000 test images; None = all")
    seed: int = Field(0, description="draws the subsets and the CIFAR -> MNIST pairing")

    @property
    def image_size(self) -> int:
        return 32


class CelebAConfig(_Dataset):
    """CelebA with attributes resampled to be independent (the MCL paper: black hair, male, smiling)."""
    root: Path | None = Field(None, description="folder holding img_align_celeba/, list_attr_celeba.txt and "
                                                "list_eval_partition.txt")
    image_size: int = Field(64, ge=16, le=256)
    attributes: list[str] = Field(default_factory=lambda: ["Black_Hair", "Male", "Smiling"], min_length=1)
    resample: bool = Field(True, description="equal counts of every attribute combination per split")
    max_per_combination: int | None = Field(None, ge=1, description="cap per combination and split (smaller runs)")
    seed: int = 0


class Stl10Config(_Dataset):
    """STL-10 binary release: unlabeled + train images train, train/test labels probe (96 px)."""
    root: Path | None = Field(None, description="folder holding stl10_binary/")
    use_unlabeled: bool = Field(True, description="train on the 100k unlabeled images too (the paper's setting)")
    max_unlabeled: int | None = Field(None, ge=1, description="first N unlabeled images only; None = all")

    @property
    def image_size(self) -> int:
        return 96


class ImageNetConfig(_Dataset):
    """ImageNet class folders (train/<wnid>/, val/<wnid>/), decoded when read; ImageNet-100 by a class list."""
    root: Path | None = Field(None, description="folder holding train/ and val/ with one folder per wnid")
    class_list: Path | None = Field(None, description="text file of wnids, one per line (ImageNet-100); None = all")
    image_size: int = Field(224, ge=16, le=512)


class TrifeaturePaperConfig(_Dataset):
    """Trifeature exactly balanced as Hermann & Lampinen: every shape x texture x colour the same number of times."""
    per_combination: int = Field(100, ge=1, description="training images per combination (1000 combinations)")
    test_per_combination: int = Field(10, ge=1, description="test images per combination")
    image_size: int = Field(64, ge=16, le=256)
    seed: int = 0


def check_channels(kind: str, in_channels: int) -> None:
    """The encoder must take as many channels as the images have."""
    want = CHANNELS.get(kind, 3)
    if in_channels != want:
        raise ValueError(f"data.kind {kind} has {want}-channel images but model.in_channels is {in_channels}: set "
                         f"--set model.in_channels={want}")


def preflight_paths(kind: str, section: _Dataset) -> None:
    """Before any compute: every folder key points at an existing folder (ConfigError naming the key). Checked here
    rather than when the config loads, so a preset whose data is elsewhere still loads (show-config, serve)."""
    for key in SOURCE_KEYS.get(kind, ()):
        value = getattr(section, key)
        if value is None:
            raise ConfigError(f"data.kind is {kind} but data.{kind}.{key} is not set: point it at the data with "
                              f"--set data.{kind}.{key}=/path/to/it (docs/datasets.md says where to get it; "
                              "nothing is downloaded)")
        if not Path(value).expanduser().exists():
            raise ConfigError(f"data.{kind}.{key} {str(value)!r} does not exist: point it at the data with --set "
                              f"data.{kind}.{key}=/path/to/it (docs/datasets.md says where to get it)")
    if kind == "imagenet" and section.class_list is not None and not Path(section.class_list).expanduser().is_file():
        raise ConfigError(f"data.imagenet.class_list {str(section.class_list)!r} does not exist: give the "
                          "ImageNet-100 class list file or unset the key for all classes")


def prepare(kind: str, section: _Dataset, *, cache_dir: Path) -> Path:
    """Prepare (or find) the dataset of ``kind`` under ``cache_dir``; returns its directory."""
    if kind == "cifar_mnist":
        from contrastive.modalities.image.datasets.cifar_mnist import prepare_cifar_mnist
        return prepare_cifar_mnist(cifar_root=section.cifar_root, mnist_root=section.mnist_root, root=cache_dir,
                                   num_train=section.num_train, num_test=section.num_test, seed=section.seed)
    if kind == "celeba":
        from contrastive.modalities.image.datasets.celeba import prepare_celeba
        return prepare_celeba(source=section.root, root=cache_dir, image_size=section.image_size,
                              attributes=section.attributes, resample=section.resample,
                              max_per_combination=section.max_per_combination, seed=section.seed)
    if kind == "stl10":
        from contrastive.modalities.image.datasets.stl10 import prepare_stl10
        return prepare_stl10(source=section.root, root=cache_dir, use_unlabeled=section.use_unlabeled,
                             max_unlabeled=section.max_unlabeled)
    if kind == "imagenet":
        from contrastive.modalities.image.datasets.imagenet import prepare_imagenet
        return prepare_imagenet(source=section.root, root=cache_dir, image_size=section.image_size,
                                class_list=section.class_list)
    if kind == "trifeature_paper":
        from contrastive.modalities.image.datasets.trifeature_paper import prepare_trifeature_paper
        return prepare_trifeature_paper(root=cache_dir, per_combination=section.per_combination,
                                        test_per_combination=section.test_per_combination,
                                        image_size=section.image_size, seed=section.seed)
    raise ConfigError(f"unknown data.kind {kind!r}: use one of {', '.join(KINDS)}")


def dataset_content(content: dict, *, kind: str) -> dict:
    """DataConfig's content without the sections of these kinds that are not selected (older configs keep keys)."""
    for name in KINDS:
        if name != kind:
            content.pop(name, None)
    return content

