"""The one typed configuration schema of mclpipe.

Every section rejects unknown keys (``extra="forbid"``), so a typo fails before any compute. Cross-field checks
that need the data size (K^N <= M / b, batch vs dataset size) live in :func:`check_feasible`, which the flow calls
once the dataset is known and before the first training step.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from contrastive.engine.task import LoopSpec, OptimSpec
from contrastive.methods.hex import HexSettings, hex_key_content
from contrastive.data.hierarchical import HierarchySpec
from contrastive.methods.moco import MocoSettings
from contrastive.methods.nnclr import NnclrSettings
from contrastive.methods.vicreg import VicregSettings
from contrastive.methods.barlow import BarlowSettings
from contrastive.methods.feature_dropout import FdSettings
from contrastive.methods.ifm import IfmSettings
from contrastive.methods.temperature_schedule import TsSettings
from contrastive.methods.amdim import AmdimSettings
from contrastive.methods.byol import ByolSettings
from contrastive.methods.cpc import CpcSettings
from contrastive.methods.parts import (MethodParts, PatchSettings, check_method_config, check_parts_fit_data,
                                       parts_in_use)
from contrastive.mcl.steps import KMeansSpec
from contrastive.errors import ConfigError
from pipeline_config import datasets as ds
from pipeline_config.launcher import LauncherConfig, check_launcher


# A field that never changes a result (log cadence, thread count, worker count): left out of content keys.
NOT_IN_KEY = {"json_schema_extra": {"affects_results": False}}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    #: Fields added after the section's first version: content() counts each only when it differs from its
    #: default (which behaves as the first version did), so earlier configs keep their content keys.
    ADDED_LATER: ClassVar[tuple[str, ...]] = ()

    def content(self) -> dict:
        """This section as JSON without the fields marked ``NOT_IN_KEY``, recursively: what a step's content
        key digests, so a new field is part of the key unless its declaration says it cannot change a result
        (or it is in ``ADDED_LATER`` and at its default)."""
        out = {}
        fields = type(self).model_fields
        for name, field in fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            if extra.get("affects_results") is False:
                continue
            value = getattr(self, name)
            if name in self.ADDED_LATER and value == fields[name].get_default(call_default_factory=True):
                continue
            out[name] = value.content() if isinstance(value, _Section) else self.model_dump(
                mode="json", include={name})[name]
        return out


class TrifeatureConfig(_Section):
    """Procedurally drawn shapes x textures x colours (Hermann & Lampinen, 2020)."""

    num_train: int = Field(10_000, ge=16)
    num_test: int = Field(3_000, ge=16)
    image_size: int = Field(32, ge=16, le=256)
    num_colors: int = Field(10, ge=2, le=10)
    num_shapes: int = Field(10, ge=2, le=10)
    num_textures: int = Field(10, ge=2, le=10)
    seed: int = 0
    hierarchy: HierarchySpec | None = Field(None, description="draw the two-level hierarchy instead "
                                            "(contrastive.data.hierarchical: families sharing texture and close "
                                            "hues; labels fine / coarse / shape); num_colors/shapes/textures unused")

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("hierarchy",)  # counts only when set


class ImageFolderConfig(_Section):
    """A user's own images, optionally with a CSV of attribute labels (column ``id`` = relative path).

    ``storage``: ``memory`` decodes every image once into ``images.npy`` (fast; host memory and disk grow with the
    number of images, fine up to ~100k small images); ``files`` writes only an index (ids, split, labels) and
    decodes each file when it is read (ImageNet scale). ``split_from_folders``: ImageNet's layout
    ``train/<class>/*.JPEG`` + ``val/<class>/*.JPEG``: the split comes from the top folder (train -> train;
    val / validation / test -> test), the class from the folder below it.
    """

    source: Path | None = None
    labels_csv: Path | None = None
    image_size: int = Field(32, ge=16, le=512)
    test_fraction: float = Field(0.25, gt=0.0, lt=1.0)
    seed: int = 0
    storage: Literal["memory", "files"] = Field("memory", description="memory = decode once into images.npy; "
                                                                      "files = index only, decode when read")
    split_from_folders: bool = Field(False, description="train/<class>/ + val/<class>/ folders give the split")
    max_skip_fraction: float = Field(0.01, ge=0.0, le=1.0, description="fail when more of the images are "
                                                                       "unreadable (else they are skipped)")


class ShardsConfig(_Section):
    """Webdataset shards (ImageNet-wds, img2dataset / CC12M-style tars): indexed once (ids, split, labels and each
    image member's byte range; no pixels), each image decoded when read (contrastive.data.shards). The train shards
    give split "train", the test shards split "test". Labels: a ``cls`` member gives attribute ``class``; the keys
    of each sample's ``json`` member named in ``label_fields`` give one attribute each."""

    train_urls: list[str] | str | None = Field(None, description="training shards: local paths or brace patterns "
                                                                 "(several joined by '::'), or a list of them")
    test_urls: list[str] | str | None = Field(None, description="test shards (probes, kNN), the same way")
    image_size: int = Field(32, ge=16, le=512)
    label_fields: list[str] = Field(default_factory=list, description="json member keys that become attributes "
                                                                      "(a cls member always gives 'class')")
    max_skip_fraction: float = Field(0.01, ge=0.0, le=1.0, description="fail when more of the samples are broken "
                                                                       "(else they are skipped)")

    @field_validator("train_urls", "test_urls")
    @classmethod
    def _local(cls, value):
        from contrastive.modalities.image_text.data import is_remote
        patterns = [value] if isinstance(value, str) else list(value or [])
        remote = [p for p in patterns for part in p.split("::") if is_remote(part.strip())]
        if remote:
            raise ValueError(f"shards {remote[0]!r} are remote: data.kind shards reads samples by byte offset and "
                             "needs local (or mounted) tar files; download them and list the local paths")
        return value

    @field_validator("label_fields")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"data.shards.label_fields lists a field twice: {value}")
        return value

    def check_paths(self) -> None:
        """Every shard of both lists exists (DataError naming the first missing one and the key to fix)."""
        from contrastive.data.shards import resolve_shard_paths
        resolve_shard_paths(self.train_urls, key="data.shards.train_urls")
        resolve_shard_paths(self.test_urls, key="data.shards.test_urls")


class DataConfig(_Section):
    kind: Literal["trifeature", "image_folder", "shards", "cifar_mnist", "celeba", "stl10", "imagenet",
                  "trifeature_paper"] = "trifeature"
    cache_dir: Path = Path("data")
    trifeature: TrifeatureConfig = TrifeatureConfig()
    image_folder: ImageFolderConfig = ImageFolderConfig()
    shards: ShardsConfig = ShardsConfig()
    # The standard datasets read from their on-disk layouts (pipeline_config/datasets.py, docs/datasets.md).
    cifar_mnist: ds.CifarMnistConfig = ds.CifarMnistConfig()
    celeba: ds.CelebAConfig = ds.CelebAConfig()
    stl10: ds.Stl10Config = ds.Stl10Config()
    imagenet: ds.ImageNetConfig = ds.ImageNetConfig()
    trifeature_paper: ds.TrifeaturePaperConfig = ds.TrifeaturePaperConfig()

    @model_validator(mode="after")
    def _source_given(self) -> "DataConfig":
        if self.kind == "image_folder" and self.image_folder.source is None:
            raise ValueError("data.kind is image_folder but data.image_folder.source is not set: "
                             "set it with --set data.image_folder.source=/path/to/images")
        if self.kind == "shards":
            unset = [k for k in ("train_urls", "test_urls") if not getattr(self.shards, k)]
            if unset:
                raise ValueError(f"data.kind is shards but data.shards.{' and data.shards.'.join(unset)} "
                                 f"{'is' if len(unset) == 1 else 'are'} not set: set them with --set "
                                 "data.shards.train_urls=/data/imagenet/train-{0000..1023}.tar (and test_urls "
                                 "for the validation shards)")
        return self

    def image_size(self) -> int:
        """The side in pixels of the images the encoder receives."""
        return getattr(self, self.kind).image_size

    def content(self) -> dict:
        """As every section's, but the shards section only counts when data.kind is shards: configs of the other
        kinds keep the hash they had before it existed."""
        content = super().content()
        if self.kind != "shards":
            content.pop("shards", None)
        return ds.dataset_content(content, kind=self.kind)


class ModelConfig(_Section):
    """The encoder and projection head: the keyword arguments of ``contrastive.models.build_model`` (same names).
    ImageNet-style: ``encoder=resnet50 stem=imagenet``; a CPU-sized ViT: ``encoder=vit_tiny`` (32 px)."""
    encoder: Literal["small_cnn", "resnet18", "resnet34", "resnet50", "vit_tiny", "vit_small", "vit_base"] = \
        "small_cnn"
    widths: list[int] = Field(default_factory=lambda: [32, 64, 128, 256], min_length=1,
                              description="small_cnn channel widths")
    projection_hidden: int = Field(256, ge=1)
    projection_dim: int = Field(128, ge=1)
    stem: Literal["cifar", "imagenet"] = Field("cifar", description="ResNet stem: cifar = 3x3 stride-1 conv1, no "
                                                                   "max-pool (32-64 px); imagenet = 7x7/2 + max-pool")
    in_channels: int = Field(3, ge=1, description="image channels (CIFAR-MNIST: 4)")
    image_size: int | None = Field(None, ge=1, description="ViT input side in pixels (the data's image size); "
                                                           "None: the preset's (vit_tiny 32, vit_small/base 224)")
    vit_patch_size: int | None = Field(None, ge=1, description="ViT patch side; None: the preset's")
    vit_depth: int | None = Field(None, ge=1, description="ViT blocks; None: the preset's")
    vit_width: int | None = Field(None, ge=1, description="ViT width; None: the preset's")
    vit_heads: int | None = Field(None, ge=1, description="ViT attention heads; None: the preset's")
    vit_mlp_width: int | None = Field(None, ge=1, description="ViT MLP width; None: the preset's (4 x width when "
                                                              "vit_width is set)")
    grad_checkpointing: bool = Field(False, description="recompute each ResNet stage / ViT block in the backward "
                                                        "pass (less memory, same result)", **NOT_IN_KEY)

    @model_validator(mode="after")
    def _consistent(self) -> "ModelConfig":
        vit_fields = ("image_size", "vit_patch_size", "vit_depth", "vit_width", "vit_heads", "vit_mlp_width")
        if self.encoder.startswith("vit_"):
            from contrastive.models.encoders import vit_preset
            p = vit_preset(self.encoder, **{name: getattr(self, name) for name in vit_fields})
            if p.image_size % p.patch_size:
                raise ValueError(f"model.image_size {p.image_size} is not a multiple of model.vit_patch_size "
                                 f"{p.patch_size} ({self.encoder}): set model.image_size to the data's image side "
                                 "and model.vit_patch_size to a divisor of it (e.g. 4 for 32 px, 16 for 224 px)")
            if p.width % p.heads:
                raise ValueError(f"model.vit_width {p.width} is not a multiple of model.vit_heads {p.heads} "
                                 f"({self.encoder}): choose heads that divide the width (e.g. 3 for 192, 6 for 384)")
        else:
            given = [name for name in vit_fields if getattr(self, name) is not None]
            if given:
                raise ValueError(f"model.{given[0]} applies to the ViT encoders only: remove it, or set model.encoder "
                                 f"to vit_tiny, vit_small or vit_base (model.encoder is {self.encoder})")
        if self.stem != "cifar" and not self.encoder.startswith("resnet"):
            raise ValueError(f"model.stem {self.stem} applies to the ResNet encoders only: remove it, or set "
                             f"model.encoder to resnet18, resnet34 or resnet50 (model.encoder is {self.encoder})")
        return self

    # Their defaults build the first version's encoders.
    ADDED_LATER: ClassVar[tuple[str, ...]] = ("stem", "in_channels", "image_size", "vit_patch_size", "vit_depth",
                                              "vit_width", "vit_heads", "vit_mlp_width")


class MethodConfig(_Section):
    name: Literal["simclr", "moco_v2", "nnclr", "byol", "amdim", "cpc_v2", "yadim", "ifm", "ts", "fd", "vicreg",
                  "barlow_twins"] = "simclr"
    temperature: float = 0.2
    # The MCL paper's baselines (contrastive.methods.baselines, docs/datasets.md); in content keys only when in use.
    ifm: IfmSettings = Field(IfmSettings(), description="IFM: latent margin epsilon, weight alpha")
    ts: TsSettings = Field(TsSettings(), description="TS: cosine temperature schedule tau_min..tau_max")
    fd: FdSettings = Field(FdSettings(), description="FD: viewmaker L1 budget and size")
    hex: HexSettings = Field(HexSettings(), description="HEX: negatives in H(i) count with weight Q in the InfoNCE "
                                                        "denominator (contrastive.methods.hex.HexSettings)")
    moco: MocoSettings = MocoSettings()
    nnclr: NnclrSettings = NnclrSettings()
    # The dimension-contrastive methods (docs/hex.md); in content keys only when in use.
    vicreg: VicregSettings = Field(VicregSettings(), description="VICReg: invariance / variance / covariance weights")
    barlow: BarlowSettings = Field(BarlowSettings(), description="Barlow Twins: off-diagonal weight lambda")
    # The five-part zoo (contrastive.methods.parts, docs/methods.md); counted in content keys only when in use.
    parts: MethodParts = Field(MethodParts(), description="each of the five parts (augmentation, encoder, "
                                                          "extraction, similarity, loss); unset: the method's own")
    byol: ByolSettings = ByolSettings()
    amdim: AmdimSettings = AmdimSettings()
    cpc: CpcSettings = CpcSettings()
    patches: PatchSettings = PatchSettings()

    @model_validator(mode="after")
    def _parts_combine(self) -> "MethodConfig":
        check_method_config(name=self.name, parts=self.parts, hex_enabled=self.hex.enabled)
        return self

    @model_validator(mode="after")
    def _dimension_hex(self) -> "MethodConfig":
        if self.name in ("vicreg", "barlow_twins"):  # their HEX term takes one scalar Q per step
            from contrastive.methods.dimension_hex import check_dimension_hex
            check_dimension_hex(self.hex.rule(), method=self.name)
        return self

    @field_validator("temperature")
    @classmethod
    def _positive_temperature(cls, value: float) -> float:
        if not value > 0:
            raise ValueError(f"method.temperature must be > 0 (got {value}); SimCLR uses 0.1-0.5")
        return value

    def queue_size(self) -> int | None:
        """Entries in the method's queue (MoCo negatives, NNCLR support set); None for SimCLR."""
        return {"moco_v2": self.moco.queue_size, "nnclr": self.nnclr.queue_size}.get(self.name)

    #: The sections of the first version; every later one enters content() only away from its defaults.
    FIRST_SECTIONS: ClassVar[tuple[str, ...]] = ("name", "temperature", "hex", "moco", "nnclr")

    def content(self) -> dict:
        """As every section's (the pipeline's config hash reads it), but the method sections added after the first
        version, and HEX's later fields, count only when they differ from their defaults: earlier configs keep
        their config hash (and so their pipeline id)."""
        content = super().content()
        defaults = type(self)(name=self.name).model_dump(mode="json")
        for name in list(content):
            if name not in self.FIRST_SECTIONS and content[name] == defaults.get(name):
                content.pop(name)
        content["hex"] = hex_key_content(content["hex"])
        return content

    def in_use(self) -> dict:
        """JSON of the settings that change training, for cache keys: other methods' sections and HEX's
        parameters while it is off are left out, so a HEX pipeline's no-HEX control shares its cached stages with
        a plain run, and plain SimCLR keys are what they were before these sections existed."""
        used = {"name": self.name, "temperature": self.temperature}
        section = self.model_dump(mode="json", include={"hex", "moco", "nnclr"})
        if self.hex.enabled:  # HEX fields added later count only away from their defaults
            used["hex"] = hex_key_content(section["hex"])
        if self.name in ("vicreg", "barlow_twins"):
            key = "vicreg" if self.name == "vicreg" else "barlow"
            used[key] = self.model_dump(mode="json", include={key})[key]
        if self.name == "moco_v2":
            used["moco"] = section["moco"]
        if self.name == "nnclr":
            used["nnclr"] = section["nnclr"]
        used.update(parts_in_use(name=self.name, sections=self.model_dump(
            mode="json", include={"parts", "byol", "amdim", "cpc", "patches"})))
        if self.name in ("ifm", "ts", "fd"):
            used[self.name] = self.model_dump(mode="json", include={self.name})[self.name]
        return used


class AugmentConfig(_Section):
    """Random resized crop only by default: colour jitter destroys the colour attribute and flips turn one
    diagonal stripe texture into the other (shared/DESIGN.md section 4). The keyword arguments of
    ``contrastive.modalities.image.augment.TwoViewAugment``, whose docstring lists the SimCLR (ImageNet) and BYOL presets, e.g.
    SimCLR: crop_scale=[0.08, 1] hflip=true color_jitter=0.4 color_jitter_hue=0.1 color_jitter_p=0.8
    grayscale_p=0.2 blur_p=0.5; BYOL: blur_p=[1.0, 0.1] solarize_p=[0.0, 0.2]."""

    crop_scale: tuple[float, float] = (0.25, 1.0)
    crop_ratio: tuple[float, float] = (0.75, 4.0 / 3.0)
    hflip: bool = False
    color_jitter: float = Field(0.0, ge=0.0, le=1.0, description="brightness / contrast / saturation strength")
    color_jitter_p: float = Field(1.0, ge=0.0, le=1.0, description="probability the colour jitter is applied")
    color_jitter_hue: float = Field(0.0, ge=0.0, le=0.5, description="hue shift range [-hue, hue] (turns); RGB")
    grayscale_p: float = Field(0.0, ge=0.0, le=1.0, description="probability of a grayscale view")
    blur_p: float | tuple[float, float] = Field(0.0, description="Gaussian blur probability, or one per view")
    blur_kernel_fraction: float = Field(0.1, gt=0.0, le=1.0, description="blur kernel size / image side")
    blur_sigma: tuple[float, float] = Field((0.1, 2.0), description="blur sigma range in pixels")
    solarize_p: float | tuple[float, float] = Field(0.0, description="solarize probability (threshold 0.5), or "
                                                                     "one per view")

    @field_validator("blur_p", "solarize_p")
    @classmethod
    def _one_value_for_equal_views(cls, value):
        # [p, p] means p: one spelling, one content key.
        return value[0] if isinstance(value, tuple) and value[0] == value[1] else value

    @model_validator(mode="after")
    def _ordered(self) -> "AugmentConfig":
        for name in ("crop_scale", "crop_ratio", "blur_sigma"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(f"augment.{name} must be (low, high) with 0 < low <= high, got {(low, high)}")
        if self.crop_scale[1] > 1.0:
            raise ValueError("augment.crop_scale upper bound must be <= 1.0 (a crop cannot exceed the image)")
        for name in ("blur_p", "solarize_p"):
            value = getattr(self, name)
            if not all(0.0 <= p <= 1.0 for p in (value if isinstance(value, tuple) else (value,))):
                raise ValueError(f"augment.{name} must be a probability in [0, 1] or a pair of them (view 1, "
                                 f"view 2), got {value}")
        return self

    # The ops added after the first version; their defaults are off.
    ADDED_LATER: ClassVar[tuple[str, ...]] = ("color_jitter_p", "color_jitter_hue", "grayscale_p", "blur_p",
                                              "blur_kernel_fraction", "blur_sigma", "solarize_p")


class LoopSettings(_Section):
    """What every stage's training loop reads (unimodal and CLIP alike); builds the engine's typed specs."""
    epochs: int = Field(8, ge=1)
    lr: float = Field(1e-3, gt=0, description="learning rate at the reference batch (see lr_scaling)")
    weight_decay: float = Field(1e-6, ge=0)
    scheduler: Literal["cosine", "constant"] = "cosine"
    warmup_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    precision: Literal["fp32", "bf16", "fp16", "amp"] = Field(
        "fp32", description="bf16 autocast; fp16 (= amp) autocast with a gradient scaler on CUDA, fp32 on CPU")
    grad_accumulation: int = Field(1, ge=1, description="micro-batches per optimizer step; each micro-batch is its "
                                                        "own contrastive batch (its own negatives)")
    grad_clip_norm: float | None = Field(None, gt=0)
    compile: bool = Field(False, description="torch.compile the forward (GPU runs; slow to start on CPU)")
    max_steps_per_epoch: int | None = Field(None, ge=1, description="cap steps per epoch (smoke runs)")
    channels_last: bool = Field(False, description="channels_last memory format for conv towers", **NOT_IN_KEY)
    log_every_steps: int = Field(10, ge=1, **NOT_IN_KEY)
    checkpoint_every_steps: int = Field(100, ge=1, **NOT_IN_KEY)
    threads: int = Field(0, ge=0, description="torch CPU threads; 0 = torch default", **NOT_IN_KEY)

    def loop_spec(self) -> LoopSpec:
        return LoopSpec(epochs=self.epochs, checkpoint_every_steps=self.checkpoint_every_steps,
                        log_every_steps=self.log_every_steps, precision=self.precision,
                        grad_accumulation=self.grad_accumulation, grad_clip_norm=self.grad_clip_norm,
                        compile=self.compile, channels_last=self.channels_last,
                        max_steps_per_epoch=self.max_steps_per_epoch)


class TrainConfig(LoopSettings):
    batch_size: int = Field(128, ge=2, description="GLOBAL batch: summed over the distributed.nproc_per_node "
                                                   "processes, each holding batch_size / nproc_per_node")
    optimizer: Literal["adam", "adamw", "sgd", "lars"] = "adam"
    channels_last: bool = Field(True, description="channels_last memory format (about 30 % faster convs on CPU)",
                                **NOT_IN_KEY)
    lr_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none", description="lr used = lr * batch_size / 256 (linear) or lr * sqrt(batch_size) (sqrt, SimCLR+LARS)")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="sgd / lars momentum")
    workers: int = Field(0, ge=0, description="DataLoader workers decoding image files (data stored as files)",
                         **NOT_IN_KEY)

    def optim_spec(self) -> OptimSpec:
        from contrastive.engine.optim import scaled_lr
        return OptimSpec(name=self.optimizer, weight_decay=self.weight_decay, schedule=self.scheduler,
                         lr=scaled_lr(base_lr=self.lr, global_batch_size=self.batch_size, rule=self.lr_scaling),
                         warmup_fraction=self.warmup_fraction, momentum=self.momentum)


class DistributedConfig(_Section):
    """Processes of one stage: > 1 runs the stage under torchrun (DDP: nccl on GPUs, gloo on CPU)."""
    nproc_per_node: int = Field(1, ge=1, description="processes (GPUs) per stage; > 1 runs the stage under torchrun")
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    nnodes: int = Field(1, ge=1, description="nodes of a multi-node launch (torchrun --nnodes)")
    rdzv_endpoint: str | None = Field(None, description="host:port of the c10d rendezvous (multi-node); default: "
                                                        "a standalone rendezvous on this node")

    def world_size(self) -> int:
        """Processes of one stage over all nodes."""
        return self.nproc_per_node * self.nnodes


class StageClusteringConfig(_Section):
    """What MCL's unimodal and CLIP pipelines share: stage count and the k-means between stages."""

    num_stages: int = Field(3, ge=1, le=100, description="stages including stage 0")
    clusters: int | list[int] = Field(
        64, description="K for k-means after each stage but the last; a list gives one K per stage")
    spherical_kmeans: bool = True
    kmeans_niter: int = Field(25, ge=1)
    kmeans_init: Literal["auto", "k-means++", "random"] = Field(
        "auto", description="centroid seeding: k-means++ on a sample, or faiss's random points; auto = "
                            "k-means++ for K <= 256")
    kmeans_train_points_per_cluster: int = Field(
        1024, ge=0, description="Lloyd's iterations run on a seeded sample of K x this many points (every point "
                                "is still assigned); 0 = on every point")
    small_group_policy: Literal["merge_nearest", "pool", "none"] = "merge_nearest"

    @field_validator("num_stages", mode="before")
    @classmethod
    def _at_least_one(cls, value):
        if isinstance(value, int) and value < 1:
            raise ValueError(f"mcl.num_stages must be >= 1 (got {value}); 1 means plain contrastive learning")
        return value

    def clusters_after(self, stage: int) -> int:
        """K used to cluster the embeddings of ``stage`` (0-based)."""
        if isinstance(self.clusters, int):
            return self.clusters
        return self.clusters[stage]

    def check_capacity(self, *, stage: int, num_train: int, global_batch: int, batch_key: str,
                       where: str = "") -> None:
        """MCL's capacity rule for stage ``stage`` (paper, Sec. 4): its batches come from one pseudo-label group of
        the prod(K_j) combinations of the earlier clusterings, so each must be able to hold a batch on average:
        prod_{j < stage} K_j <= M / B (M training samples, B the global batch)."""
        if global_batch > num_train:
            raise ConfigError(f"{where}{batch_key}={global_batch} is larger than the {num_train} training samples: "
                              f"lower it (--set {batch_key}={max(2, num_train // 8)}) or use more data")
        if stage == 0:
            return
        groups = math.prod(self.clusters_after(j) for j in range(stage))
        capacity = num_train / global_batch
        if groups > capacity:
            suggestion = max(2, int(capacity) // 2 ** (stage - 1))
            raise ConfigError(
                f"{where}MCL needs prod(K) <= M/b so every pseudo-label group can hold a batch: K={self.clusters} "
                f"over {stage} clusterings gives up to {groups} groups but M/b = {num_train}/{global_batch} = "
                f"{capacity:.0f}. Fix: fewer clusters (e.g. --set mcl.clusters=[{suggestion}{', 2' * (stage - 1)}]), "
                f"a smaller {batch_key}, fewer mcl.num_stages, or more data")

    def kmeans_spec(self, stage: int, *, seed: int) -> KMeansSpec:
        """The k-means after ``stage`` (``contrastive.mcl.steps.cluster_stage``)."""
        k = self.clusters_after(stage)
        per_cluster = self.kmeans_train_points_per_cluster
        return KMeansSpec(k=k, seed=seed, niter=self.kmeans_niter, spherical=self.spherical_kmeans,
                          init=self.kmeans_init, max_train_points=k * per_cluster if per_cluster else None)

    @model_validator(mode="after")
    def _cluster_list_length(self) -> "StageClusteringConfig":
        needed = self.num_stages - 1
        if isinstance(self.clusters, list) and len(self.clusters) < needed:
            raise ValueError(f"mcl.clusters lists {len(self.clusters)} values but {needed} clusterings are needed "
                             f"for {self.num_stages} stages: give one K per stage but the last, or a single int")
        values = [self.clusters] if isinstance(self.clusters, int) else self.clusters
        if any(k < 2 for k in values):
            raise ValueError(f"mcl.clusters must be >= 2 (got {self.clusters})")
        return self


class MclConfig(StageClusteringConfig):
    """Multistage contrastive learning: stage j >= 1 draws every batch from one pseudo-label group, where the
    pseudo-label combines the k-means cluster ids of ALL earlier stages."""

    remainder_policy: Literal["partial", "pool", "drop"] = "partial"
    control: bool = Field(True, description="also train the same number of plain SimCLR stages with random "
                                            "batches and concatenate them, to separate MCL's gain from ensembling")
    inherit: bool = Field(False, description="naive inheritance (paper Table 5): MCL stage j starts from stage "
                                             "j-1's trained weights instead of a fresh encoder (an ablation)")
    cumulative_concat: bool = Field(False, description="also evaluate stages 0..j concatenated for every j "
                                                       "(learning dynamics, paper Fig. 5)")

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("inherit", "cumulative_concat")  # count only when on


class EvalConfig(_Section):
    probe_max_iter: int = Field(300, ge=10)
    probe_c: float = Field(1.0, gt=0)
    probe_max_train: int = Field(10_000, ge=100, description="train-split samples used to fit each probe")
    knn_k: int = Field(20, ge=1)


class TrackingConfig(_Section):
    uri: str | None = Field(None, description="MLflow tracking URI; None = $MLFLOW_TRACKING_URI or "
                                              "sqlite:///mlflow.db in the working directory")
    experiment: str = "mclpipe"
    system_metrics_seconds: float = Field(10.0, ge=0, description="sample CPU, memory (and GPU) into each training "
                                                                  "stage's run every N seconds; 0 = off")
    registered_model: str | None = Field(None, description="MLflow registry name of the pipeline's final encoder "
                                                           "(alias 'current' = latest finished pipeline); None = "
                                                           "the config's name")


class ScheduleConfig(_Section):
    """When `mclpipe serve` registers this config as a Prefect deployment: a cron expression or an interval."""

    cron: str | None = None
    interval_minutes: float | None = Field(None, gt=0)
    timezone: str = "UTC"

    @model_validator(mode="after")
    def _one_kind(self) -> "ScheduleConfig":
        if self.cron and self.interval_minutes:
            raise ValueError("schedule: set either cron or interval_minutes, not both")
        if self.cron and len(self.cron.split()) not in (5, 6):
            raise ValueError(f"schedule.cron {self.cron!r} is not a cron expression (e.g. '0 3 * * *' = 03:00 daily)")
        return self


class _PipelineBase(_Section):
    """The top of every pipeline config (MCL and CLIP) and its hash. Subclasses give ``pipeline`` and ``name`` their
    literal and default (a redeclared field keeps its place, so these stay first in a dumped config) and declare
    ``tracking`` and ``schedule`` last themselves, after their own sections."""

    pipeline: str
    name: str = Field(**NOT_IN_KEY)
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    output_dir: Path = Field(Path("runs"), **NOT_IN_KEY)

    @model_validator(mode="after")
    def _launcher_fits(self) -> "_PipelineBase":
        if hasattr(self, "launcher"):
            check_launcher(self)
        return self

    def for_stage(self, stage: int) -> "_PipelineBase":
        """The config stage ``stage`` runs with: this one (PipelineConfig applies its stage_overrides)."""
        return self

    def global_batch_size(self, stage: int) -> int:
        """Samples per optimizer step of ``stage`` over all processes (a pseudo-label group must hold one)."""
        raise NotImplementedError

    def config_hash(self) -> str:
        """Digest of everything that changes results: ``name``, ``output_dir``, ``tracking`` and ``schedule`` do not,
        so renaming a run, moving its outputs or its tracking server, or scheduling it reuses the same results."""
        content = self.content()
        if not content.get("stage_overrides", True):
            del content["stage_overrides"]  # so configs without any keep the hash they had before the field existed
        return digest_of(content)


class PipelineConfig(_PipelineBase):
    """Everything one MCL pipeline needs. ``name``, ``output_dir``, ``tracking`` and ``schedule`` do not change
    results and are left out of the config hash; everything else is in it."""

    pipeline: Literal["mcl"] = "mcl"
    name: str = Field("mcl", **NOT_IN_KEY)
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    method: MethodConfig = MethodConfig()
    augment: AugmentConfig = AugmentConfig()
    train: TrainConfig = TrainConfig()
    mcl: MclConfig = MclConfig()
    eval: EvalConfig = EvalConfig()
    distributed: DistributedConfig = DistributedConfig()
    launcher: LauncherConfig = Field(LauncherConfig(), **NOT_IN_KEY)  # where stages run, never what they compute
    stage_overrides: dict[int, dict[str, Any]] = Field(
        default_factory=dict,
        description="per-stage changes to the model, method, augment and train sections, e.g. "
                    "{2: {train: {epochs: 20}}}: stage 2 (MCL and control) trains 20 epochs. Stages without an "
                    "entry keep their content keys, so with --rerun-from N a change here recomputes only stage N on")
    tracking: TrackingConfig = Field(TrackingConfig(), **NOT_IN_KEY)
    schedule: ScheduleConfig = Field(ScheduleConfig(), **NOT_IN_KEY)

    @model_validator(mode="after")
    def _check_stage_overrides(self) -> "PipelineConfig":
        for stage, patch in self.stage_overrides.items():
            if not 0 <= stage < self.mcl.num_stages:
                raise ValueError(f"stage_overrides has stage {stage} but the stages are 0..{self.mcl.num_stages - 1}")
            unknown = sorted(set(patch) - set(STAGE_SECTIONS))
            if unknown:
                raise ValueError(f"stage_overrides.{stage} changes {', '.join(unknown)}: only the sections "
                                 f"{', '.join(STAGE_SECTIONS)} can differ between stages")
            self.for_stage(stage)  # every stage's config must be valid on its own
        return self

    def global_batch_size(self, stage: int) -> int:
        return self.for_stage(stage).train.batch_size

    @model_validator(mode="after")
    def _channels_fit_the_images(self) -> "PipelineConfig":
        if self.data.kind in ds.KINDS:
            ds.check_channels(self.data.kind, self.model.in_channels)
        return self

    @model_validator(mode="after")
    def _hex_warmup_fits(self) -> "PipelineConfig":
        hex_settings = self.method.hex
        if hex_settings.enabled and hex_settings.warmup_epochs >= self.train.epochs:
            raise ValueError(f"method.hex.warmup_epochs={hex_settings.warmup_epochs} is not below train.epochs="
                             f"{self.train.epochs}: HEX would never start; lower method.hex.warmup_epochs or raise "
                             "train.epochs")
        return self

    @model_validator(mode="after")
    def _vit_fits_the_images(self) -> "PipelineConfig":
        if self.model.encoder.startswith("vit_"):
            from contrastive.models.encoders import vit_preset
            side = vit_preset(self.model.encoder, image_size=self.model.image_size).image_size
            if side != self.data.image_size():
                raise ValueError(f"model.encoder {self.model.encoder} takes {side} px images but the data are "
                                 f"{self.data.image_size()} px: set --set model.image_size={self.data.image_size()} "
                                 f"(with a model.vit_patch_size that divides it)")
        return self

    @model_validator(mode="after")
    def _method_parts_fit_the_images(self) -> "PipelineConfig":
        check_parts_fit_data(method=self.method.model_dump(mode="json"), model_encoder=self.model.encoder,
                             image_size=self.data.image_size())
        return self

    @model_validator(mode="after")
    def _batch_splits(self) -> "PipelineConfig":
        n = self.distributed.world_size()
        if self.train.batch_size % n or self.train.batch_size // n < 2:
            raise ValueError(f"train.batch_size={self.train.batch_size} is the global batch: it must be a multiple "
                             f"of the {n} processes (distributed.nproc_per_node x nnodes) with at least 2 samples "
                             "each: change one of them")
        return self

    def for_stage(self, stage: int) -> "PipelineConfig":
        """The config stage ``stage`` trains with: stage_overrides[stage] merged into the model, method, augment
        and train sections (self when the stage has no override). The result has no stage_overrides of its own."""
        patch = self.stage_overrides.get(stage)
        if not patch:
            return self
        raw = _deep_merge(self.model_dump(mode="json", exclude={"stage_overrides"}), patch)
        try:
            return PipelineConfig.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
            raise ValueError(f"stage_overrides.{stage}: {problems}") from None


STAGE_SECTIONS = ("model", "method", "augment", "train")


def _deep_merge(base: dict, patch: dict) -> dict:
    """base with patch's values; nested dicts are merged key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def digest_of(value) -> str:
    """Stable 16-hex digest of a JSON-serialisable value (keys sorted)."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def check_feasible(config: PipelineConfig, *, num_train: int) -> None:
    """Checks that need the dataset size, run before any training, for every stage's config (stage_overrides).

    MCL draws every batch of stage j from one pseudo-label group. With K clusters per stage and N clusterings,
    there are up to K^N groups; each must hold at least a batch on average: prod(K_j) <= M / b (paper, Sec. 4).
    """
    name_stage = bool(config.stage_overrides)  # say which stage fails when stages differ
    # Last stage first: with one batch size everywhere its capacity rule (most groups) implies the earlier stages',
    # so a config without stage_overrides fails on the same check, with the same suggested fix, as it always did.
    for stage in reversed(range(config.mcl.num_stages)):
        _check_stage_feasible(config.for_stage(stage), stage=stage, num_train=num_train, name_stage=name_stage)


def _check_stage_feasible(config: PipelineConfig, *, stage: int, num_train: int, name_stage: bool) -> None:
    """The checks for one stage: batch and queue against the data, and prod(K over earlier clusterings) <= M / b."""
    batch = config.train.batch_size
    where = f"stage {stage}: " if name_stage else ""
    queue = config.method.queue_size()
    if queue is not None and queue > num_train - batch:
        section = "moco" if config.method.name == "moco_v2" else "nnclr"
        raise ConfigError(f"{where}method.{section}.queue_size={queue} leaves fewer than a batch of the {num_train} "
                          f"training samples out of the queue, so it would hold stale copies of the current batch: "
                          f"lower it (--set method.{section}.queue_size={max(1, (num_train - batch) // 2)})")
    config.mcl.check_capacity(stage=stage, num_train=num_train, global_batch=batch, batch_key="train.batch_size",
                              where=where)


def preflight(config: PipelineConfig) -> None:
    """Every check that can run before any compute: input paths exist, and the cluster/batch capacity rule
    when the training-set size is known from the config alone (generated data)."""
    data = config.data
    if data.kind == "shards":
        data.shards.check_paths()
    elif data.kind == "image_folder":
        source = data.image_folder.source
        if source is None or not Path(source).is_dir():
            raise ConfigError(f"data.image_folder.source {str(source)!r} is not a directory: point it at your "
                              f"images with --set data.image_folder.source=/path/to/images")
        csv = data.image_folder.labels_csv
        if csv is not None and not Path(csv).is_file():
            raise ConfigError(f"data.image_folder.labels_csv {str(csv)!r} does not exist: fix the path or drop "
                              f"the key to use class subfolders as labels")
    elif data.kind in ds.KINDS:
        ds.preflight_paths(data.kind, getattr(data, data.kind))
    else:
        check_feasible(config, num_train=data.trifeature.num_train)


# ==================================================================================================== CLIP MCL
# ``pipeline: clip`` configs (loader.config_schema_for): MCL for CLIP on image-text webdataset shards (MCL paper,
# Sec. 5.5). Built by flows.clip_flow.clip_pipeline; docs/clip.md explains every section.
class ClipSyntheticConfig(_Section):
    """Tiny procedurally drawn image-text shards, a held-out set and an MMVP-style directory, written on first use
    into data.cache_dir (used when data.shards is not set)."""

    num_train: int = Field(480, ge=16)
    num_heldout: int = Field(64, ge=8)
    samples_per_shard: int = Field(96, ge=1)
    image_size: int = Field(32, ge=16, le=256)
    num_colors: int = Field(4, ge=2, le=10)
    num_shapes: int = Field(4, ge=2, le=10)
    num_textures: int = Field(4, ge=2, le=10)
    corrupt: bool = Field(True, description="include a truncated image and a sample without caption")
    mmvp_pairs_per_category: int = Field(2, ge=1)
    seed: int = 0


class ClipDataConfig(_Section):
    shards: str | None = Field(None, description="training shards: brace pattern(s) joined by '::', local paths or "
                                                 "pipe:/http(s)/s3/gs URLs; None = synthetic shards")
    heldout_shards: str | None = Field(None, description="held-out image-text shards for zero-shot retrieval")
    num_samples: int | None = Field(None, ge=1, description="samples in data.shards when no sizes.json / "
                                                            "*_stats.json files are beside them (remote shards)")
    max_skip_fraction: float = Field(0.01, ge=0.0, le=1.0, description="fail when more of the samples are broken")
    shuffle_buffer: int = Field(1000, ge=0, description="stage-0 sample shuffle buffer")
    decode_workers: int = Field(0, ge=0, description="threads decoding images (0 = in the training thread)")
    cache_dir: Path = Path("data")
    synthetic: ClipSyntheticConfig = ClipSyntheticConfig()


class ClipModelConfig(_Section):
    name: str = Field("mclpipe-tiny-vit", description="open_clip model name, or local-dir:/path")
    pretrained: str | None = Field(None, description="weights file path, or an open_clip tag already in the local "
                                                     "cache (nothing is downloaded); None = seeded random init")
    require_pretrained: bool = Field(False, description="fail before any compute when model.pretrained is unset")
    init_seed: int = 0
    trainable_image_blocks: int = Field(6, ge=1, description="LAST image transformer blocks trained (+ ln_post, proj)")
    lock_text: bool = True
    train_logit_scale: bool = True
    cache_dir: str | None = Field(None, description="where to look for tag weights (default: Hugging Face cache)")


class ClipTrainConfig(LoopSettings):
    epochs: int = Field(1, ge=1)
    global_batch_size: int = Field(32, ge=2, description="samples per step over all processes; every batch of a "
                                                         "stage >= 1 comes from one pseudo-label group")
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.1, ge=0)
    warmup_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    precision: Literal["fp32", "bf16", "fp16", "amp"] = "amp"
    grad_checkpointing: bool = False
    checkpoint_every_steps: int = Field(500, ge=1, **NOT_IN_KEY)

    def optim_spec(self) -> OptimSpec:
        """AdamW with CLIP's betas and eps (open_clip's fine-tuning defaults)."""
        return OptimSpec(name="adamw", lr=self.lr, weight_decay=self.weight_decay, schedule=self.scheduler,
                         warmup_fraction=self.warmup_fraction, betas=(0.9, 0.98), eps=1e-6)


class ClipDistributedConfig(DistributedConfig):
    local_loss: bool = Field(False, description="each rank computes its rows of the logits (O(B*WB) memory)")
    data_slots: int | None = Field(None, ge=1, description="slots the shards and group re-shards are laid out in "
                                   "(default: one per process); a multiple of the processes, each reading its share "
                                   "side by side: the same global batches, hence the same training, whatever the "
                                   "number of processes, so a rerun on fewer GPUs keeps the data order")

    def slots(self) -> int:
        return self.data_slots or self.world_size()

    @model_validator(mode="after")
    def _slots_split(self) -> "ClipDistributedConfig":
        if self.slots() % self.world_size():
            raise ValueError(f"distributed.data_slots={self.data_slots} must be a multiple of the "
                             f"{self.world_size()} processes (nproc_per_node x nnodes)")
        return self

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("data_slots",)  # counts only when set


class ClipMclConfig(StageClusteringConfig):
    """Stage j >= 1 trains from the same init on cluster-pure batches; groups combine the k-means ids of ALL
    earlier stages."""

    num_stages: int = Field(2, ge=1, le=100, description="stages including stage 0")
    clusters: int | list[int] = Field(10, description="K after each stage but the last; a list gives one per stage")
    remainder_policy: Literal["partial", "drop"] = "partial"
    active_streams: int = Field(16, ge=1, description="groups read at once by the cluster-pure reader")
    group_shuffle_buffer: int = Field(0, ge=0, description="extra per-group shuffle buffer while reading")
    spool_mb: int = Field(256, ge=1, description="memory for the per-stage re-shard by group")


class ClipEvalConfig(_Section):
    mmvp_dir: Path | None = Field(None, description="local MMVP_VLM copy or pairs.csv directory; None = the "
                                                    "synthetic one when data.shards is unset, else skipped")
    mmvp_prompt: str = Field("a photo of ", description="prefix of every MMVP statement (upstream: 'a photo of ')")
    retrieval_max_samples: int = Field(5000, ge=10)
    batch_size: int = Field(256, ge=1)
    export_batch_size: int = Field(256, ge=1)
    soup: bool = Field(True, description="also evaluate the weight average of the stage models")


class ClipPipelineConfig(_PipelineBase):
    """One CLIP MCL pipeline. ``name``, ``output_dir``, ``tracking`` and ``schedule`` are left out of the hash."""

    pipeline: Literal["clip"] = "clip"
    name: str = Field("clip", **NOT_IN_KEY)
    data: ClipDataConfig = ClipDataConfig()
    model: ClipModelConfig = ClipModelConfig()
    train: ClipTrainConfig = ClipTrainConfig()
    distributed: ClipDistributedConfig = ClipDistributedConfig()
    mcl: ClipMclConfig = ClipMclConfig()
    eval: ClipEvalConfig = ClipEvalConfig()
    launcher: LauncherConfig = Field(LauncherConfig(), **NOT_IN_KEY)  # where stages run, never what they compute
    tracking: TrackingConfig = Field(TrackingConfig(), **NOT_IN_KEY)
    schedule: ScheduleConfig = Field(ScheduleConfig(), **NOT_IN_KEY)

    def global_batch_size(self, stage: int) -> int:
        return self.train.global_batch_size

    @model_validator(mode="after")
    def _batch_splits(self) -> "ClipPipelineConfig":
        n, slots = self.distributed.world_size(), self.distributed.slots()
        if self.train.global_batch_size % slots or self.train.global_batch_size // n < 2:
            raise ValueError(f"train.global_batch_size={self.train.global_batch_size} must split into {n} equal "
                             f"per-process batches of at least 2 and into distributed.data_slots={slots} equal "
                             "parts")
        return self


def check_clip_pretrained(config: ClipPipelineConfig) -> None:
    """A preset that needs pretrained weights (the paper's ViT-L-14 OpenAI init) fails before any compute when
    model.pretrained is unset; the config still loads, so `mclpipe show-config` works."""
    if config.model.require_pretrained and not config.model.pretrained:
        raise ConfigError("model.pretrained must be set for this config (mclpipe never downloads weights): "
                          "--set model.pretrained=/path/to/open_clip_model.safetensors (docs/clip.md says where to "
                          "get the OpenAI ViT-L-14 file)")


def check_clip_feasible(config: ClipPipelineConfig, *, num_train: int) -> None:
    """K^N <= M / B for CLIP MCL (B = global batch): every pseudo-label group must be able to fill a batch."""
    config.mcl.check_capacity(stage=config.mcl.num_stages - 1, num_train=num_train,
                              global_batch=config.train.global_batch_size, batch_key="train.global_batch_size")