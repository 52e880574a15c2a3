"""The image modality's config (``pipeline: image``, the default; ``mcl``, its old name, still reads): data (Trifeature, image folders, shards, the paper
datasets), encoder, method, augmentation, training, MCL, evaluation; per-stage overrides; the checks that need the
dataset size. Every section rejects unknown keys; ``content()`` feeds the steps' content keys.
"""
from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from contrastive.engine.task import OptimSpec
from contrastive.methods.hex import HexSettings, hex_key_content
from contrastive.modalities.image.datasets.hierarchical import HierarchySpec
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
from contrastive.errors import ConfigError
from contrastive.modalities.image import dataset_config as ds
from contrastive.settings import (NOT_IN_KEY, LoopSettings, MclConfig, _deep_merge,
                                  _PipelineBase, _Section)


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
                                            "(contrastive.modalities.image.datasets.hierarchical: families sharing texture and close "
                                            "hues; labels fine / coarse / shape); num_colors/shapes/textures unused")

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("hierarchy",)  # counts only when set


class ImageFolderConfig(_Section):
    """A user's own images, optionally with a CSV of attribute labels (column ``id`` = relative path).

    ``storage``: ``memory`` decodes every image once into ``images.npy`` (fast; host memory and disk grow with the
    number of images, fine up to ~100k small images); ``files`` writes only an index (ids, split, labels) and
    decodes each file when it is read (ImageNet scale). ``split_from_folders``: ImageNet's layout
    ``train/<class>/*.JPEG`` + ``val/<class>/*.JPEG``: the split comes from the top folder (train -> train;
    val / validation / test -> test), the class from the folder below it. ``decode_scale``: how JPEGs are decoded
    (``contrastive.modalities.image.datasets.image_folder``'s docstring); part of the prepared dataset's key.
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
    decode_scale: Literal["auto", "full"] = Field(
        "auto", description="auto = JPEGs decoded by libjpeg-turbo (at 1/2, 1/4 or 1/8 scale where the square "
                            "keeps its detail) and resampled by torch: about 1.6x faster than 'full', the same pixels "
                            "to rounding at full scale; full = PIL (folders prepared before this setting)")

    # Counted only when not the default: the prepared dataset's digest carries the decoding into every later key,
    # and configs of the other kinds (Trifeature) keep the keys they had.
    ADDED_LATER: ClassVar[tuple[str, ...]] = ("decode_scale",)


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
        from contrastive.data.urls import is_remote
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
    # The standard datasets read from their on-disk layouts (contrastive/modalities/image/dataset_config.py, docs/datasets.md).
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


class TrainConfig(LoopSettings):
    batch_size: int = Field(128, ge=2, description="GLOBAL batch: summed over the distributed.nproc_per_node "
                                                   "processes, each holding batch_size / nproc_per_node")
    optimizer: Literal["adam", "adamw", "sgd", "lars"] = "adam"
    channels_last: bool = Field(True, description="channels_last memory format (about 30 % faster convs on CPU)",
                                **NOT_IN_KEY)
    lr_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none", description="lr used = lr * batch_size / 256 (linear) or lr * sqrt(batch_size) (sqrt, SimCLR+LARS)")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="sgd / lars momentum")
    workers: int | None = Field(
        None, ge=0, description="DataLoader workers decoding image files (data stored as files, shards); unset = "
                                "the cores available to the process, shared by the node's processes, less one "
                                "(contrastive.data.loading.default_workers)", **NOT_IN_KEY)
    # Not in the key: the pixels are the workers' to rounding (at most 1-2 levels of 255 a pixel, ~0.005 on
    # average: contrastive.data.image_decode.resample_squares), as train.tf32 changes results by float noise only.
    resample_on_gpu: bool = Field(
        False, description="CUDA, an image folder stored as files (decode_scale auto): the DataLoader workers "
                           "ship each JPEG's decoded centre square and the GPU resamples the batch to image_size "
                           "(the same pixels to rounding); on a CPU run the workers resample, as without it",
        **NOT_IN_KEY)

    # Adam and AdamW read no momentum (contrastive.engine.optim.build_optimizer).
    USED_ONLY_WITH: ClassVar[dict[str, tuple[str, tuple]]] = {**LoopSettings.USED_ONLY_WITH,
                                                              "momentum": ("optimizer", ("sgd", "lars"))}

    def optim_spec(self) -> OptimSpec:
        from contrastive.engine.optim import scaled_lr
        return OptimSpec(name=self.optimizer, weight_decay=self.weight_decay, schedule=self.scheduler,
                         lr=scaled_lr(base_lr=self.lr, global_batch_size=self.batch_size, rule=self.lr_scaling),
                         warmup_fraction=self.warmup_fraction, momentum=self.momentum)


class ImageMclConfig(MclConfig):
    """MCL's settings and the image pipeline's two ablations of the paper."""

    inherit: bool = Field(False, description="naive inheritance (paper Table 5): MCL stage j starts from stage "
                                             "j-1's trained weights instead of a fresh encoder (an ablation)")
    cumulative_concat: bool = Field(False, description="also evaluate stages 0..j concatenated for every j "
                                                       "(learning dynamics, paper Fig. 5)")

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("inherit", "cumulative_concat")  # count only when on


OLD_KEY = "mcl"  # the image pipeline's key before it was "image"


@functools.cache  # one line per process, however many configs (sweep points, stages) are read
def _say_old_key() -> None:
    logging.getLogger(__name__).warning("pipeline: mcl is the image pipeline's old name; write pipeline: image")


class ImagePipelineConfig(_PipelineBase):
    """Everything one MCL pipeline needs. ``name``, ``output_dir``, ``tracking`` and ``schedule`` do not change
    results and are left out of the config hash; everything else is in it."""

    # "mcl" (the key's old name) is read as "image" with one warning: configs and deployments written before.
    pipeline: Literal["image", "mcl"] = "image"
    name: str = Field("mcl", **NOT_IN_KEY)
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    method: MethodConfig = MethodConfig()
    augment: AugmentConfig = AugmentConfig()
    train: TrainConfig = TrainConfig()
    mcl: ImageMclConfig = ImageMclConfig()
    stage_overrides: dict[int, dict[str, Any]] = Field(
        default_factory=dict,
        description="per-stage changes to the model, method, augment and train sections, e.g. "
                    "{2: {train: {epochs: 20}}}: stage 2 (MCL and control) trains 20 epochs. Stages without an "
                    "entry keep their content keys, so with --rerun-from N a change here recomputes only stage N on")

    @field_validator("pipeline")  # after: a discriminator field takes no before validator
    @classmethod
    def _old_key(cls, value: str) -> str:
        if value == OLD_KEY:
            _say_old_key()
            return "image"
        return value

    def content(self) -> dict:
        """With ``pipeline`` under its old name (``mcl``), so image pipelines keep the config hashes (pipeline
        ids) of runs made before the key was ``image``."""
        return {**super().content(), "pipeline": OLD_KEY}

    @model_validator(mode="after")
    def _check_stage_overrides(self) -> "ImagePipelineConfig":
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
    def _channels_fit_the_images(self) -> "ImagePipelineConfig":
        if self.data.kind in ds.KINDS:
            ds.check_channels(self.data.kind, self.model.in_channels)
        return self

    @model_validator(mode="after")
    def _hex_warmup_fits(self) -> "ImagePipelineConfig":
        hex_settings = self.method.hex
        if hex_settings.enabled and hex_settings.warmup_epochs >= self.train.epochs:
            raise ValueError(f"method.hex.warmup_epochs={hex_settings.warmup_epochs} is not below train.epochs="
                             f"{self.train.epochs}: HEX would never start; lower method.hex.warmup_epochs or raise "
                             "train.epochs")
        return self

    @model_validator(mode="after")
    def _vit_fits_the_images(self) -> "ImagePipelineConfig":
        if self.model.encoder.startswith("vit_"):
            from contrastive.models.encoders import vit_preset
            side = vit_preset(self.model.encoder, image_size=self.model.image_size).image_size
            if side != self.data.image_size():
                raise ValueError(f"model.encoder {self.model.encoder} takes {side} px images but the data are "
                                 f"{self.data.image_size()} px: set --set model.image_size={self.data.image_size()} "
                                 f"(with a model.vit_patch_size that divides it)")
        return self

    @model_validator(mode="after")
    def _method_parts_fit_the_images(self) -> "ImagePipelineConfig":
        check_parts_fit_data(method=self.method.model_dump(mode="json"), model_encoder=self.model.encoder,
                             image_size=self.data.image_size())
        return self

    @model_validator(mode="after")
    def _batch_splits(self) -> "ImagePipelineConfig":
        n = self.distributed.world_size()
        if self.train.batch_size % n or self.train.batch_size // n < 2:
            raise ValueError(f"train.batch_size={self.train.batch_size} is the global batch: it must be a multiple "
                             f"of the {n} processes (distributed.nproc_per_node x nnodes) with at least 2 samples "
                             "each: change one of them")
        return self

    def for_stage(self, stage: int) -> "ImagePipelineConfig":
        """The config stage ``stage`` trains with: stage_overrides[stage] merged into the model, method, augment
        and train sections (self when the stage has no override). The result has no stage_overrides of its own."""
        patch = self.stage_overrides.get(stage)
        if not patch:
            return self
        raw = _deep_merge(self.model_dump(mode="json", exclude={"stage_overrides"}), patch)
        try:
            return type(self).model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
            raise ValueError(f"stage_overrides.{stage}: {problems}") from None


STAGE_SECTIONS = ("model", "method", "augment", "train")


def check_feasible(config: ImagePipelineConfig, *, num_train: int) -> None:
    """Checks that need the dataset size, run before any training, for every stage's config (stage_overrides).

    MCL draws every batch of stage j from one pseudo-label group. With K clusters per stage and N clusterings,
    there are up to K^N groups; each must hold at least a batch on average: prod(K_j) <= M / b (paper, Sec. 4).
    """
    name_stage = bool(config.stage_overrides)  # say which stage fails when stages differ
    # Last stage first: with one batch size everywhere its capacity rule (most groups) implies the earlier stages',
    # so a config without stage_overrides fails on the same check, with the same suggested fix, as it always did.
    for stage in reversed(range(config.mcl.num_stages)):
        _check_stage_feasible(config.for_stage(stage), stage=stage, num_train=num_train, name_stage=name_stage)


def _check_stage_feasible(config: ImagePipelineConfig, *, stage: int, num_train: int, name_stage: bool) -> None:
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


def preflight(config: ImagePipelineConfig) -> None:
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


CONFIG = ImagePipelineConfig
