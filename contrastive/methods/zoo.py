"""Builds BYOL, AMDIM, CPC v2 and YADIM from their five parts (``contrastive.methods.parts``), and swaps the
encoder of SimCLR / MoCo-v2 / NNCLR when ``method.parts.encoder`` asks for AMDIM's."""
from __future__ import annotations

from torch import nn

from contrastive.methods.amdim import AmdimSettings, FeatureMapNCE
from contrastive.methods.base import ContrastiveMethod
from contrastive.methods.byol import BYOL, ByolSettings
from contrastive.methods.cpc import CPCv2, CpcSettings
from contrastive.methods.parts import (MethodParts, PatchSettings, check_encoder_fits, check_method_config)
from contrastive.models.amdim_encoder import AmdimEncoder
from contrastive.models.encoders import ContrastiveModel, ProjectionHead


def method_parts(*, name: str, model_kwargs: dict, method_kwargs: dict) -> MethodParts:
    """The resolved five parts of a ``method`` section (ConfigError for a combination that does not make sense)."""
    hex_enabled = bool((method_kwargs.get("hex") or {}).get("enabled", False))
    parts = check_method_config(name=name, parts=method_kwargs.get("parts"), hex_enabled=hex_enabled)
    check_encoder_fits(parts=parts, model_encoder=model_kwargs["encoder"])
    return parts


def encoder_part(*, parts: MethodParts, model: ContrastiveModel, model_kwargs: dict,
                 method_kwargs: dict) -> nn.Module:
    """The encoder f: ``model.backbone`` (``backbone``) or a fresh AMDIM encoder sized for the whole view
    (``method.amdim.image_size``) or for one patch (``method.patches.size``)."""
    if parts.encoder == "backbone":
        return model.backbone
    amdim = AmdimSettings(**(method_kwargs.get("amdim") or {}))
    side = PatchSettings(**(method_kwargs.get("patches") or {})).size if parts.augmentation == "patches" \
        else amdim.image_size
    multiscale = parts.extraction in ("multiscale", "same_level", "last_random")
    return AmdimEncoder(image_size=side, width=amdim.width, rkhs_dim=amdim.rkhs_dim, depth=amdim.depth,
                        in_channels=model_kwargs.get("in_channels", 3), scales=(1, 5, 7) if multiscale else (1,))


def with_encoder_part(*, name: str, model: ContrastiveModel, model_kwargs: dict,
                      method_kwargs: dict) -> ContrastiveModel:
    """SimCLR / MoCo-v2 / NNCLR: the model with its backbone (and the head's input width) replaced when
    ``method.parts.encoder`` is amdim; the model itself otherwise."""
    parts = method_parts(name=name, model_kwargs=model_kwargs, method_kwargs=method_kwargs)
    if parts.encoder == "backbone":
        return model
    backbone = encoder_part(parts=parts, model=model, model_kwargs=model_kwargs, method_kwargs=method_kwargs)
    head = ProjectionHead(in_dim=backbone.out_dim, hidden_dim=model_kwargs["projection_hidden"],
                          out_dim=model_kwargs["projection_dim"])
    return ContrastiveModel(backbone=backbone, head=head)


def build_zoo_method(*, name: str, model: ContrastiveModel, model_kwargs: dict,
                     method_kwargs: dict) -> ContrastiveMethod:
    """BYOL, AMDIM, CPC v2 or YADIM from the config's ``model`` and ``method`` sections (as JSON)."""
    parts = method_parts(name=name, model_kwargs=model_kwargs, method_kwargs=method_kwargs)
    backbone = encoder_part(parts=parts, model=model, model_kwargs=model_kwargs, method_kwargs=method_kwargs)
    patch = PatchSettings(**(method_kwargs.get("patches") or {}))
    patches = (patch.size, patch.stride) if parts.augmentation == "patches" else None
    if name == "byol":
        byol = ByolSettings(**(method_kwargs.get("byol") or {}))
        dim = model_kwargs["projection_dim"]
        head = model.head if backbone is model.backbone else ProjectionHead(
            in_dim=backbone.out_dim, hidden_dim=model_kwargs["projection_hidden"], out_dim=dim)
        predictor = ProjectionHead(in_dim=dim, hidden_dim=byol.predictor_hidden, out_dim=dim)
        return BYOL(backbone=backbone, head=head, predictor=predictor, tau_base=byol.tau_base)
    if name in ("amdim", "yadim"):
        return FeatureMapNCE(backbone=backbone, parts=parts,
                             settings=AmdimSettings(**(method_kwargs.get("amdim") or {})), patches=patches)
    if name == "cpc_v2":
        return CPCv2(backbone=backbone, dim=backbone.out_dim,
                     settings=CpcSettings(**(method_kwargs.get("cpc") or {})), patches=patches)
    raise ValueError(f"{name!r} is not a zoo method")
