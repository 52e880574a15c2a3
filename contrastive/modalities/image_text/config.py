"""The image-text modality's config (``pipeline: clip``): MCL for CLIP on image-text webdataset shards (MCL paper,
Sec. 5.5); docs/clip.md explains every section.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from contrastive.engine.task import OptimSpec
from contrastive.errors import ConfigError
from contrastive.settings import (NOT_IN_KEY, DistributedConfig, LoopSettings, StageClusteringConfig, _PipelineBase,
                                  _Section)


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
    decode_workers: int | None = Field(
        None, ge=0, description="worker processes decoding and augmenting images, kept for the stage (0 = in the "
                                "reading thread); unset = the cores available to the process, shared by the node's "
                                "processes, less one (contrastive.data.loading.default_workers)", **NOT_IN_KEY)
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
    spool_mb: int = Field(256, ge=1, description="members the per-stage re-shard by group gathers before "
                                                 "appending them to its files (staged on disk, up to about 2.5x)")


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


CONFIG = ClipPipelineConfig
