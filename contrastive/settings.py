"""The typed config sections every modality's pipeline config builds on: the section base (unknown keys rejected,
``content()`` for content keys), the training-loop, distributed, MCL clustering, evaluation, tracking and schedule
sections, and the top of every pipeline config (:class:`_PipelineBase`). Each modality's own sections and its
pipeline config class (``CONFIG``) live in its package (``contrastive/modalities/<name>/config.py``) and build on
these, so each setting and its rule is defined once.

Where a stage's processes run (the ``launcher`` section) is the one part of a pipeline config the library does not
define: its types build the launchers, so ``pipeline_config.schema`` adds it to a modality's ``CONFIG``
(``pipeline_config.schema.config_class``), and the library never imports ``pipeline_config``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contrastive.credentials import refuse_credentials_in_uri
from contrastive.data.dataset import params_hash
from contrastive.engine.task import LoopSpec
from contrastive.errors import ConfigError
from contrastive.mcl.steps import KMeansSpec


# A field that never changes a result (log cadence, thread count, worker count): left out of content keys.
NOT_IN_KEY = {"json_schema_extra": {"affects_results": False}}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    #: Fields added after the section's first version: content() counts each only when it differs from its
    #: default (which behaves as the first version did), so earlier configs keep their content keys.
    ADDED_LATER: ClassVar[tuple[str, ...]] = ()

    #: Fields that another field of the section decides the use of: {field: (that field, its values that use it)}.
    #: Under any other value the field changes nothing (Adam reads no momentum), so content() counts it at its
    #: default: its key no longer follows it, and a config that left it at the default keeps the key it had.
    USED_ONLY_WITH: ClassVar[dict[str, tuple[str, tuple]]] = {}

    def content(self) -> dict:
        """This section as JSON without the fields marked ``NOT_IN_KEY``, recursively: what a step's content
        key digests, so a new field is part of the key unless its declaration says it cannot change a result
        (or it is in ``ADDED_LATER`` and at its default); a field the section does not use (``USED_ONLY_WITH``)
        counts at its default."""
        out = {}
        fields = type(self).model_fields
        for name, field in fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            if extra.get("affects_results") is False:
                continue
            value, source = getattr(self, name), self
            default = fields[name].get_default(call_default_factory=True)
            if name in self.USED_ONLY_WITH and not self.uses(name):
                value, source = default, self.model_copy(update={name: default})
            if name in self.ADDED_LATER and value == default:
                continue
            out[name] = value.content() if isinstance(value, _Section) else source.model_dump(
                mode="json", include={name})[name]
        return out

    def uses(self, name: str) -> bool:
        """Whether field ``name`` can change a result under this section's other settings (``USED_ONLY_WITH``)."""
        if name not in self.USED_ONLY_WITH:
            return True
        selector, values = self.USED_ONLY_WITH[name]
        return getattr(self, selector) in values


class LoopSettings(_Section):
    """What every stage's training loop reads (unimodal and CLIP alike); builds the engine's typed specs."""
    epochs: int = Field(8, ge=1)
    lr: float = Field(1e-3, gt=0, description="learning rate at the reference batch (see lr_scaling)")
    weight_decay: float = Field(1e-6, ge=0)
    scheduler: Literal["cosine", "constant"] = "cosine"
    warmup_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    precision: Literal["fp32", "bf16", "fp16", "amp", "auto"] = Field(
        "fp32", description="bf16 autocast; fp16 (= amp) autocast with a gradient scaler on CUDA, fp32 on CPU; auto: "
                            "bf16 where the device computes in it natively (a recent GPU or an AMX / AVX512-BF16 "
                            "CPU), else fp32")
    grad_accumulation: int = Field(1, ge=1, description="micro-batches per optimizer step; each micro-batch is its "
                                                        "own contrastive batch (its own negatives)")
    grad_clip_norm: float | None = Field(None, gt=0)
    compile: bool = Field(False, description="torch.compile the forward (GPU runs; slow to start on CPU)")
    max_steps_per_epoch: int | None = Field(None, ge=1, description="cap steps per epoch (smoke runs)")
    channels_last: bool = Field(False, description="channels_last memory format for conv towers", **NOT_IN_KEY)
    log_every_steps: int = Field(10, ge=1, **NOT_IN_KEY)
    checkpoint_every_steps: int = Field(100, ge=1, **NOT_IN_KEY)
    threads: int = Field(0, ge=0, description="torch CPU threads; 0 = torch default", **NOT_IN_KEY)
    on_nonfinite: Literal["stop", "rollback"] = Field(
        "stop", description="a NaN / inf loss: stop the stage, or roll back to the last checkpoint, skip the batch "
                            "that diverged and scale the learning rate by rollback_lr_factor (max_rollbacks times)")
    max_rollbacks: int = Field(3, ge=1)
    rollback_lr_factor: float = Field(0.5, gt=0, le=1)
    tf32: bool = Field(True, description="CUDA: TF32 matmuls and convolutions (float noise only)", **NOT_IN_KEY)
    cudnn_benchmark: bool = Field(True, description="CUDA: cuDNN picks the fastest kernels per shape", **NOT_IN_KEY)
    stall_seconds: float | None = Field(300.0, gt=0, description="stop the stage when its reader delivers no batch "
                                                                 "for this long (3x for an epoch's first batch)",
                                        **NOT_IN_KEY)

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("on_nonfinite", "max_rollbacks", "rollback_lr_factor")
    # A loop that stops at a NaN never rolls back.
    USED_ONLY_WITH: ClassVar[dict[str, tuple[str, tuple]]] = {"max_rollbacks": ("on_nonfinite", ("rollback",)),
                                                              "rollback_lr_factor": ("on_nonfinite", ("rollback",))}

    def loop_spec(self) -> LoopSpec:
        return LoopSpec(epochs=self.epochs, checkpoint_every_steps=self.checkpoint_every_steps,
                        log_every_steps=self.log_every_steps, precision=self.precision,
                        grad_accumulation=self.grad_accumulation, grad_clip_norm=self.grad_clip_norm,
                        compile=self.compile, channels_last=self.channels_last,
                        max_steps_per_epoch=self.max_steps_per_epoch, on_nonfinite=self.on_nonfinite,
                        max_rollbacks=self.max_rollbacks, rollback_lr_factor=self.rollback_lr_factor, tf32=self.tf32,
                        cudnn_benchmark=self.cudnn_benchmark, stall_seconds=self.stall_seconds)


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


class EvalConfig(_Section):
    probe_max_iter: int = Field(300, ge=10)
    probe_c: float = Field(1.0, gt=0)
    probe_max_train: int = Field(10_000, ge=100, description="train-split samples used to fit each probe")
    knn_k: int = Field(20, ge=1)


class TrackingConfig(_Section):
    # a refused uri holds a password: keep it out of the error's text
    model_config = ConfigDict(extra="forbid", validate_assignment=True, hide_input_in_errors=True)

    uri: str | None = Field(None, description="MLflow tracking URI; None = $MLFLOW_TRACKING_URI or "
                                              "sqlite:///mlflow.db in the working directory")
    experiment: str = "mclpipe"
    system_metrics_seconds: float = Field(10.0, ge=0, description="sample CPU, memory (and GPU) into each training "
                                                                  "stage's run every N seconds; 0 = off")
    registered_model: str | None = Field(None, description="MLflow registry name of the pipeline's final encoder "
                                                           "(alias 'current' = latest finished pipeline); None = "
                                                           "the config's name")
    outage_grace_seconds: float = Field(600.0, ge=0, description="how long a tracking server that answered before "
                                                                 "may be away (restarted, redeployed) before the run "
                                                                 "stops: training goes on meanwhile and its metrics "
                                                                 "wait in the stage's step directory")

    @field_validator("uri")
    @classmethod
    def _no_credentials(cls, uri: str | None) -> str | None:
        return refuse_credentials_in_uri(uri, name="tracking.uri")


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


def in_process_only_message(config) -> str:
    """The one line for a config whose modality runs its stages in the flow's process but asks for more."""
    return (f"{config.pipeline} stages ({config.IN_PROCESS_ONLY}) run in one process, in the flow's: set "
            "distributed.nproc_per_node=1, distributed.nnodes=1 and launcher.kind=local")


class _PipelineBase(_Section):
    """The top of every modality's pipeline config and its hash: what every pipeline has whatever its data (seed,
    device, where its files, processes and tracking go, its schedule). Subclasses give ``pipeline`` and ``name``
    their literal and default (a redeclared field keeps its place, so these stay first in a dumped config) and add
    the modality's own sections."""

    pipeline: str
    name: str = Field(**NOT_IN_KEY)
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    output_dir: Path = Field(Path("runs"), **NOT_IN_KEY)
    tracking: TrackingConfig = Field(TrackingConfig(), **NOT_IN_KEY)
    schedule: ScheduleConfig = Field(ScheduleConfig(), **NOT_IN_KEY)
    distributed: DistributedConfig = DistributedConfig()
    eval: EvalConfig = EvalConfig()

    #: Set by a modality whose stages run only in the flow's process (its ``title``, for the message).
    IN_PROCESS_ONLY: ClassVar[str | None] = None

    @model_validator(mode="after")
    def _one_process(self) -> "_PipelineBase":
        if self.IN_PROCESS_ONLY and self.distributed.world_size() != 1:
            raise ValueError(in_process_only_message(self))
        return self

    def for_stage(self, stage: int) -> "_PipelineBase":
        """The config stage ``stage`` runs with: this one (PipelineConfig applies its stage_overrides)."""
        return self

    def train_key_content(self) -> dict:
        """The train section as a stage's content key holds it: ``precision: auto`` as the precision it resolves
        to on the kind of device the stage runs on (``auto`` and ``bf16`` train alike where the device computes in
        bf16, and ``auto`` is not ``bf16`` where it means fp32). A stage a cluster launcher runs on another machine
        keeps ``auto``: the node that keys it cannot tell what that machine computes in."""
        content = self.train.content()
        if content.get("precision") == "auto":
            content["precision"] = self.resolved_precision()
        return content

    def resolved_precision(self) -> str:
        """``train.precision`` as a stage of this config runs it here (``auto`` where that cannot be known here:
        a cluster launcher, or ``device: cuda`` without a GPU, which fails before any training)."""
        precision = self.train.precision
        if precision != "auto" or getattr(getattr(self, "launcher", None), "remote", False):
            return precision
        import torch

        from contrastive.engine.precision import resolve_precision
        kind = "cpu" if self.device == "cpu" or not torch.cuda.is_available() else "cuda"
        if self.device == "cuda" and kind == "cpu":
            return precision
        return resolve_precision(precision, device=torch.device(kind))

    def global_batch_size(self, stage: int) -> int:
        """Samples per optimizer step of ``stage`` over all processes (a pseudo-label group must hold one): the
        train section's ``batch_size`` unless a modality says otherwise."""
        return self.train.batch_size

    def config_hash(self) -> str:
        """Digest of everything that changes results: ``name``, ``output_dir``, ``tracking`` and ``schedule`` do not,
        so renaming a run, moving its outputs or its tracking server, or scheduling it reuses the same results."""
        content = self.content()
        if not content.get("stage_overrides", True):
            del content["stage_overrides"]  # so configs without any keep the hash they had before the field existed
        return digest_of(content)


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
    """Stable 16-hex digest of a JSON-serialisable value (keys sorted): a step's content key."""
    return params_hash(value, length=16)
