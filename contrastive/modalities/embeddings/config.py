"""The config of the embeddings pipeline (``pipeline: embeddings``): MCL over precomputed feature vectors with
small MLP encoders (docs/embeddings.md). Built like every pipeline config: sections reject unknown keys,
``content()`` feeds the steps' content keys, the stage loop and k-means are the shared ``MclConfig``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from contrastive.engine.task import OptimSpec
from contrastive.errors import ConfigError
from contrastive.settings import NOT_IN_KEY, LoopSettings, MclConfig, _PipelineBase, _Section


class SyntheticFeaturesConfig(_Section):
    """Features mixing independent attributes at different strengths (``data.synthetic_features``): the dominant
    one is what plain contrastive learning keeps, the weaker ones what MCL's later stages recover."""
    num_train: int = Field(2048, ge=16)
    num_test: int = Field(512, ge=16)
    dim: int = Field(64, ge=2)
    classes: dict[str, int] = Field({"dominant": 4, "weak": 4}, description="attribute -> number of classes")
    scales: dict[str, float] = Field({"dominant": 3.0, "weak": 1.0}, description="attribute -> prototype norm")
    noise: float = Field(0.3, ge=0)
    seed: int = 0

    @model_validator(mode="after")
    def _same_attributes(self) -> "SyntheticFeaturesConfig":
        if set(self.classes) != set(self.scales) or not self.classes:
            raise ValueError(f"data.synthetic.classes {sorted(self.classes)} and data.synthetic.scales "
                             f"{sorted(self.scales)} must name the same attributes")
        if any(count < 2 for count in self.classes.values()):
            raise ValueError("data.synthetic.classes: every attribute needs at least 2 classes")
        return self


class FeatureFilesConfig(_Section):
    """The user's features: an ``.npy`` of N x D floats (e.g. a frozen backbone's outputs), optional ids (one a
    line, or an .npy) and an optional labels CSV (``id`` column + one column per attribute) for the scores."""
    features: Path | None = None
    ids: Path | None = None
    labels: Path | None = None
    test_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="rows held out for the probe and kNN scores")


class FeaturesDataConfig(_Section):
    kind: Literal["synthetic", "files"] = "synthetic"
    cache_dir: Path = Path("data")
    synthetic: SyntheticFeaturesConfig = SyntheticFeaturesConfig()
    files: FeatureFilesConfig = FeatureFilesConfig()

    @model_validator(mode="after")
    def _features_given(self) -> "FeaturesDataConfig":
        if self.kind == "files" and self.files.features is None:
            raise ValueError("data.kind is files but data.files.features is not set: set --set "
                             "data.files.features=/path/to/features.npy (an N x D array)")
        return self

    def content(self) -> dict:
        content = super().content()
        content.pop("files" if self.kind == "synthetic" else "synthetic")
        return content


class MlpEncoderConfig(_Section):
    """The encoder of every stage: ``depth`` Linear-BatchNorm-ReLU layers of width ``hidden`` to a ``dim``-d
    representation, and (training only) SimCLR's projection head to ``projection_dim``."""
    hidden: int = Field(256, ge=2)
    depth: int = Field(2, ge=1)
    dim: int = Field(32, ge=2, description="representation width of one stage (MCL concatenates the stages')")
    projection_dim: int = Field(32, ge=2)


class FeatureViewsConfig(_Section):
    """NT-Xent (SimCLR's loss) between two views of every vector: each view drops features at random and adds
    Gaussian noise (in units of each feature's standard deviation over the training split)."""
    temperature: float = Field(0.2, gt=0)
    feature_dropout: float = Field(0.2, ge=0.0, lt=1.0)
    noise: float = Field(0.1, ge=0.0)


class FeaturesTrainConfig(LoopSettings):
    epochs: int = Field(10, ge=1)
    batch_size: int = Field(256, ge=2, description="vectors per step; every batch of a stage >= 1 comes from one "
                                                   "pseudo-label group")
    optimizer: Literal["adam", "adamw"] = "adam"

    def optim_spec(self) -> OptimSpec:
        return OptimSpec(name=self.optimizer, lr=self.lr, weight_decay=self.weight_decay, schedule=self.scheduler,
                         warmup_fraction=self.warmup_fraction)


class FeaturesMclConfig(MclConfig):
    num_stages: int = Field(2, ge=1, le=100, description="stages including stage 0")
    clusters: int | list[int] = Field(4, description="K for k-means after each stage but the last")


class EmbeddingsPipelineConfig(_PipelineBase):
    """One MCL pipeline over feature vectors. ``name``, ``output_dir``, ``launcher``, ``tracking`` and ``schedule``
    are left out of the hash."""

    pipeline: Literal["embeddings"] = "embeddings"
    name: str = Field("embeddings", **NOT_IN_KEY)
    data: FeaturesDataConfig = FeaturesDataConfig()
    model: MlpEncoderConfig = MlpEncoderConfig()
    method: FeatureViewsConfig = FeatureViewsConfig()
    train: FeaturesTrainConfig = FeaturesTrainConfig()
    mcl: FeaturesMclConfig = FeaturesMclConfig()


def check_features_feasible(config: EmbeddingsPipelineConfig, *, num_train: int) -> None:
    """Batch <= training vectors and MCL's prod(K) <= M / b, for every stage."""
    for stage in reversed(range(config.mcl.num_stages)):
        config.mcl.check_capacity(stage=stage, num_train=num_train, global_batch=config.train.batch_size,
                                  batch_key="train.batch_size")


def preflight_features(config: EmbeddingsPipelineConfig) -> None:
    """Checks before any compute: the files exist; the capacity rule on synthetic data."""
    data = config.data
    if data.kind == "files":
        for key in ("features", "ids", "labels"):
            path = getattr(data.files, key)
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"data.files.{key} {str(path)!r} does not exist: fix the path or drop the key")
    else:
        check_features_feasible(config, num_train=data.synthetic.num_train)


CONFIG = EmbeddingsPipelineConfig
