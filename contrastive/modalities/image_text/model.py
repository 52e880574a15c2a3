"""open_clip models for CLIP MCL: creation from one shared init, block-count freezing, precision, saving.

MCL for CLIP (Section 5.5 of the MCL paper) fine-tunes a pretrained CLIP stage by stage. Every stage starts from
the SAME init (the pretrained weights, or for tests the same seeded random init), never from the previous stage:
inheriting weights keeps the features the earlier stage already learnt, which is what MCL tries to avoid. The text
tower stays fixed; the image tower trains only its last N transformer blocks (the paper uses N = 6 for ViT-L-14).

N counts BLOCKS. open_clip's own ``lock_image_tower(unlocked_groups=n)`` counts groups
``[stem], block_0, ..., block_{L-2}, [block_{L-1} + ln_post], proj`` from the end, so ``unlocked_groups=6`` would
train only 4 blocks plus the projection. :func:`freeze_for_finetuning` therefore sets ``requires_grad`` itself.

Nothing is downloaded here. A pretrained *tag* (``openai``) is used only when open_clip's or Hugging Face's cache
already holds its file; otherwise :class:`~contrastive.errors.DataError` says how to supply a local file.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import open_clip
import torch
from torch import nn

from contrastive.engine.checkpoint import save_torch
from contrastive.engine.safe_load import load_torch_file, unsafe_file_error
from contrastive.errors import ConfigError, DataError

log = logging.getLogger(__name__)

# Shipped as package data (pyproject: contrastive.modalities.image_text = ["model_configs/*.json"]).
CONFIG_DIR = Path(__file__).resolve().parent / "model_configs"
TINY_MODEL = "mclpipe-tiny-vit"
# CLIP clamps its learnable temperature so logits never exceed 100 (Radford et al., 2021, Sec. 2.5).
MAX_LOGIT_SCALE = 100.0

_registered = False


# ---------------------------------------------------------------------------------------------------- registry
def register_model_configs() -> list[str]:
    """Register the JSON model configs shipped in ``contrastive/modalities/image_text/model_configs`` with open_clip (idempotent).

    Returns the registered model names (e.g. ``mclpipe-tiny-vit``: 2-layer ViT of width 64 on 32 px images,
    2-layer text transformer of width 64, context 16, embed_dim 32; about 3.4M parameters, random init).
    """
    global _registered
    directory = CONFIG_DIR
    names = sorted(p.stem for p in directory.glob("*.json"))
    if not _registered:
        open_clip.add_model_config(directory)
        _registered = True
    return names


# ---------------------------------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class ClipSpec:
    """Everything that determines a stage's initial weights and how they are trained.

    model_name: an open_clip model name (``ViT-L-14-quickgelu``, ``mclpipe-tiny-vit``) or ``local-dir:/path``.
    pretrained: None (seeded random init), an open_clip tag that must already be in the local cache, or a path
        to a weights file. init_seed: seed of the random init (ignored with pretrained weights).
    trainable_image_blocks: N, the number of LAST image transformer blocks trained (plus ln_post and proj).
    lock_text: keep the whole text tower fixed (the paper's setting). train_logit_scale: learn the temperature.
    cache_dir: where to look for tag weights (open_clip's ``cache_dir``; default the Hugging Face cache).
    """

    model_name: str
    pretrained: str | None = None
    init_seed: int = 0
    trainable_image_blocks: int = 6
    lock_text: bool = True
    train_logit_scale: bool = True
    cache_dir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, value: dict) -> "ClipSpec":
        return cls(**value)


# ---------------------------------------------------------------------------------------------------- pretrained
def _cached_tag_file(*, model_name: str, tag: str, cache_dir: str | None) -> str | None:
    """Local path of a pretrained tag's weights if open_clip or the HF hub cache already holds them, else None."""
    cfg = open_clip.get_pretrained_cfg(model_name, tag)
    if cfg.get("file"):
        return cfg["file"] if os.path.isfile(cfg["file"]) else None
    if cfg.get("hf_hub"):
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:  # pragma: no cover - huggingface_hub ships with open_clip
            try_to_load_from_cache = None
        if try_to_load_from_cache is not None:
            repo_id, filename = os.path.split(cfg["hf_hub"])
            for name in ([filename] if filename else ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]):
                found = try_to_load_from_cache(repo_id=repo_id, filename=name, cache_dir=cache_dir)
                if isinstance(found, str) and os.path.isfile(found):
                    return found
    if cfg.get("url"):
        root = cache_dir or os.path.expanduser("~/.cache/clip")
        candidate = os.path.join(root, os.path.basename(cfg["url"]))
        if os.path.isfile(candidate):
            return candidate
    return None


def resolve_pretrained(*, model_name: str, pretrained: str | None,
                       cache_dir: str | None = None) -> tuple[str | None, dict[str, Any]]:
    """(local weights file or None, extra open_clip kwargs) for ``pretrained``; never downloads.

    A tag is resolved to its cached file (with the tag's quick_gelu / mean / std); a path must exist.
    Raises DataError naming how to supply the weights when neither works.
    """
    if pretrained is None or model_name.startswith(("local-dir:", "hf-hub:")):
        return None, {}
    if os.path.isfile(os.path.expanduser(pretrained)):
        return os.path.expanduser(pretrained), {}
    cfg = open_clip.get_pretrained_cfg(model_name, pretrained)
    if not cfg:
        raise DataError(
            f"model.pretrained={pretrained!r} is neither an existing file nor a pretrained tag of {model_name} "
            f"(tags: {', '.join(open_clip.list_pretrained_tags_by_model(model_name)) or 'none'}); set it to the "
            "path of a local weights file (e.g. --set model.pretrained=/models/ViT-L-14.pt)")
    path = _cached_tag_file(model_name=model_name, tag=pretrained, cache_dir=cache_dir)
    if path is None:
        source = cfg.get("hf_hub") or cfg.get("url")
        raise DataError(
            f"pretrained weights {model_name}/{pretrained} are not in the local cache and mclpipe never downloads "
            f"weights. Fetch them on a machine with internet ({source}; e.g. `huggingface-cli download "
            f"{str(cfg.get('hf_hub', '')).rstrip('/')} open_clip_model.safetensors`), copy the file here and set "
            "--set model.pretrained=/path/to/that/file")
    extra: dict[str, Any] = {}
    if cfg.get("quick_gelu"):
        extra["force_quick_gelu"] = True
    if cfg.get("mean") and cfg.get("std"):
        extra["image_mean"], extra["image_std"] = tuple(cfg["mean"]), tuple(cfg["std"])
    return path, extra


def file_fingerprint(path: str | None) -> str | None:
    """Cheap identity of a weights file (name, size, SHA-256 of its first and last MiB) for content keys."""
    if path is None:
        return None
    p = Path(path)
    size = p.stat().st_size
    digest = hashlib.sha256()
    with open(p, "rb") as handle:
        digest.update(handle.read(1 << 20))
        if size > 2 << 20:
            handle.seek(size - (1 << 20))
            digest.update(handle.read())
    return f"{p.name}:{size}:{digest.hexdigest()[:16]}"


# ---------------------------------------------------------------------------------------------------- creation
class _DropRandomInitWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "No pretrained weights loaded" not in record.getMessage()


@contextlib.contextmanager
def _quiet_random_init(*, expected: bool):
    """open_clip warns on the root logger at every random init; for the tiny model that is the plan, not news."""
    if not expected:
        yield
        return
    dropper = _DropRandomInitWarning()
    root = logging.getLogger()
    root.addFilter(dropper)
    try:
        yield
    finally:
        root.removeFilter(dropper)


@dataclass
class ClipBundle:
    """A created model with its transforms and tokenizer.

    train_transform / eval_transform: PIL image -> float (3, S, S). tokenizer: list[str] -> int64 (B, context).
    """

    model: nn.Module
    train_transform: Callable
    eval_transform: Callable
    tokenizer: Callable
    spec: ClipSpec
    weights_file: str | None


def create_clip(*, spec: ClipSpec, device: torch.device | str = "cpu") -> ClipBundle:
    """Create the stage's initial model: the pretrained weights, or the seeded random init.

    Every call with the same spec returns identical weights (the random init runs under a forked, seeded torch
    RNG, so it neither depends on nor changes the caller's RNG state). Freezing is applied
    (:func:`freeze_for_finetuning`).
    """
    register_model_configs()
    if {"weights_only", "jit"} & set(spec.extra):
        raise ConfigError("model.extra may not set weights_only or jit: mclpipe loads weights only as tensors "
                          "(weights_only=True), never as code; remove them from model.extra")
    weights, extra = resolve_pretrained(model_name=spec.model_name, pretrained=spec.pretrained,
                                        cache_dir=spec.cache_dir)
    try:
        with torch.random.fork_rng(devices=[]), _quiet_random_init(expected=weights is None):
            # the CPU generator alone: open_clip builds the model on the CPU and then moves it, and
            # torch.manual_seed would reseed (or queue a reseed of) every GPU's generator, outside the fork
            torch.default_generator.manual_seed(spec.init_seed)
            # open_clip reads .bin/.pt weights with torch.load(weights_only=True) (.safetensors with safetensors):
            # said here too, so that no change of its default reads a weights file as code
            model, train_tf, eval_tf = open_clip.create_model_and_transforms(
                spec.model_name, pretrained=weights, device=device, weights_only=True, **extra, **spec.extra)
    except pickle.UnpicklingError as exc:
        raise unsafe_file_error(weights or spec.model_name, what="pretrained weights file", exc=exc) from None
    except RuntimeError as exc:
        if "not found" in str(exc) or "Unknown model" in str(exc):
            raise ConfigError(f"open_clip has no model {spec.model_name!r} ({exc}); use one of "
                              f"open_clip.list_models() or {TINY_MODEL}") from exc
        raise DataError(f"could not load weights {weights} into {spec.model_name} ({exc}); check that the file "
                        "holds CLIP weights for this model name") from exc
    freeze_for_finetuning(model, trainable_image_blocks=spec.trainable_image_blocks, lock_text=spec.lock_text,
                          train_logit_scale=spec.train_logit_scale)
    tokenizer = open_clip.get_tokenizer(spec.model_name)
    return ClipBundle(model=model, train_transform=train_tf, eval_transform=eval_tf, tokenizer=tokenizer,
                      spec=spec, weights_file=weights)


# ---------------------------------------------------------------------------------------------------- freezing
def image_blocks(model: nn.Module) -> nn.ModuleList:
    """The image tower's transformer blocks, (L,) in forward order; ConfigError for non-ViT towers."""
    visual = getattr(model, "visual", None)
    blocks = getattr(getattr(visual, "transformer", None), "resblocks", None)
    if blocks is None:
        raise ConfigError(f"model.trainable_image_blocks needs a ViT image tower with transformer.resblocks; "
                          f"{type(visual).__name__} has none: use a ViT model (e.g. ViT-L-14-quickgelu)")
    return blocks


def freeze_for_finetuning(model: nn.Module, *, trainable_image_blocks: int, lock_text: bool = True,
                          train_logit_scale: bool = True) -> list[str]:
    """Set requires_grad for MCL CLIP fine-tuning; returns the names of the trainable parameters.

    Image tower: everything frozen except its last ``trainable_image_blocks`` transformer blocks, ``ln_post`` and
    ``proj`` (and an attention-pool head if the model has one). Counting is in blocks, not open_clip groups.
    Text tower: frozen with open_clip's ``lock_text_tower(unlocked_layers=0, freeze_layer_norm=True)`` (open_clip
    3.3 asserts the layer-norm flag) when ``lock_text``. The logit scale follows ``train_logit_scale``.
    """
    blocks = image_blocks(model)
    n = int(trainable_image_blocks)
    if not 0 <= n <= len(blocks):
        raise ConfigError(f"model.trainable_image_blocks={n} but the image tower has {len(blocks)} blocks: "
                          f"use 0..{len(blocks)}")
    visual = model.visual
    for param in visual.parameters():
        param.requires_grad = False
    if n > 0:
        for block in blocks[len(blocks) - n:]:
            block.requires_grad_(True)
        for name in ("ln_post", "attn_pool", "proj"):
            part = getattr(visual, name, None)
            if isinstance(part, nn.Parameter):
                part.requires_grad = True
            elif isinstance(part, nn.Module):
                part.requires_grad_(True)
    if lock_text:
        model.lock_text_tower(unlocked_layers=0, freeze_layer_norm=True)
    if hasattr(model, "logit_scale"):
        model.logit_scale.requires_grad = bool(train_logit_scale)
    return trainable_names(model)


def trainable_names(model: nn.Module) -> list[str]:
    return [name for name, param in model.named_parameters() if param.requires_grad]


def trainable_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached CPU copies of the trainable parameters only (the rest equals the shared init)."""
    return {name: param.detach().cpu().clone() for name, param in model.named_parameters() if param.requires_grad}


def load_trainable_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy saved trainable parameters into a model created from the same spec; DataError on a mismatch."""
    params = dict(model.named_parameters())
    missing = [name for name in state if name not in params]
    if missing:
        raise DataError(f"saved stage model has parameters {missing[:3]} the model lacks: it was trained with a "
                        "different model.name; rerun the stage or restore the config it was trained with")
    with torch.no_grad():
        for name, value in state.items():
            if params[name].shape != value.shape:
                raise DataError(f"saved parameter {name} has shape {tuple(value.shape)}, model has "
                                f"{tuple(params[name].shape)}: the stage was trained with another model config")
            params[name].copy_(value.to(params[name].device, params[name].dtype))


# ---------------------------------------------------------------------------------------------------- precision
# ---------------------------------------------------------------------------------------------------- stage models
def save_stage_model(*, model: nn.Module, spec: ClipSpec, path: Path, weights_file: str | None) -> Path:
    """Write ``{spec, trainable_state, weights_fingerprint}``: the init is rebuilt from the spec and only the
    trained parameters are stored (for ViT-L-14 with 6 trainable blocks about a quarter of the full model)."""
    path = Path(path)
    save_torch({"spec": spec.to_dict(), "trainable_state": trainable_state_dict(model),
                "weights_fingerprint": file_fingerprint(weights_file)}, path, what="the stage's model")
    return path


def load_stage_model(*, path: Path, device: torch.device | str = "cpu") -> ClipBundle:
    """Rebuild a stage model written by :func:`save_stage_model`, in eval mode."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"stage model {path} is missing: rerun the pipeline to retrain that stage")
    saved = load_torch_file(path, what="stage model")
    bundle = create_clip(spec=ClipSpec.from_dict(saved["spec"]), device="cpu")
    fingerprint = file_fingerprint(bundle.weights_file)
    if saved.get("weights_fingerprint") != fingerprint:
        log.warning("stage model %s was trained from weights %s but the init now resolves to %s",
                    path, saved.get("weights_fingerprint"), fingerprint)
    load_trainable_state(bundle.model, saved["trainable_state"])
    bundle.model.to(device).eval()
    return bundle


def load_stage_states(paths: list[Path]) -> tuple[dict, list[dict[str, torch.Tensor]]]:
    """(spec dict of the first, trainable states of all) of saved stage models; DataError if specs differ."""
    specs, states = [], []
    for path in paths:
        if not Path(path).is_file():
            raise DataError(f"stage model {path} is missing: rerun the pipeline to retrain that stage")
        saved = load_torch_file(path, what="stage model (a soup's input)")
        specs.append(saved["spec"])
        states.append(saved["trainable_state"])
    if any(s != specs[0] for s in specs[1:]):
        raise DataError("stage models were built from different specs (model, init or frozen blocks); a soup "
                        "needs stages that share one init: rerun the pipeline with one model config")
    return specs[0], states
