"""The five parts of a contrastive method (Falcon & Cho, "A Framework for Contrastive Self-Supervised Learning and
Designing a New Approach", section 2): (1) data augmentation pipeline, (2) encoder, (3) representation extraction,
(4) similarity measure, (5) loss.

Every method has its own choice of each part (:data:`DEFAULT_PARTS`); the config's ``method.parts`` section
replaces any of them where that combination makes sense (:data:`ALLOWED`) and is rejected with a ConfigError that
names the valid choices where it does not. The choices:

- augmentation: ``views`` (the ``augment`` section applied twice to the whole image: SimCLR / AMDIM / BYOL) or
  ``patches`` (each view then cut into overlapping square patches: CPC's sixth transform a', which YADIM keeps).
- encoder: ``backbone`` (``model.encoder``: small_cnn / resnet / vit, one pooled vector) or ``amdim`` (AMDIM's
  encoder without padding or batch norm, with 7x7, 5x5 and 1x1 feature maps: ``method.amdim``).
- extraction: ``global`` (one vector per view), ``multiscale`` (AMDIM: the 1-5, 1-7 and 5-5 map comparisons),
  ``last`` (YADIM: last map against last map), ``last_random`` (last map against a map drawn each step),
  ``same_level`` (1-1, 5-5, 7-7), ``context`` (CPC: a row-causal context network predicts rows below).
- similarity: ``cosine`` (projection head, cosine / temperature), ``predicted_cosine`` (BYOL: predictor on the
  online side, cosine), ``dot`` (AMDIM / YADIM: dot product / sqrt(d), tanh-clipped), ``predicted_dot`` (CPC:
  W_k c_ij . H_i+k,j).
- loss: ``nce`` (InfoNCE / NCE over negatives) or ``regression`` (BYOL's 2 - 2 cos, no negatives).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from contrastive.errors import ConfigError
from contrastive.methods.hex import STRICT

PART_NAMES = ("augmentation", "encoder", "extraction", "similarity", "loss")
CHOICES = {
    "augmentation": ("views", "patches"),
    "encoder": ("backbone", "amdim"),
    "extraction": ("global", "multiscale", "last", "last_random", "same_level", "context"),
    "similarity": ("cosine", "predicted_cosine", "dot", "predicted_dot", "squared_distance", "cross_correlation"),
    "loss": ("nce", "regression", "variance_covariance", "redundancy_reduction"),
}
#: Methods built from feature maps, patches or predictors (``contrastive.methods.zoo``); their sections
#: (byol, amdim, cpc, patches) count in content keys only when one of them is in use.
ZOO_METHODS = ("byol", "amdim", "cpc_v2", "yadim")


@dataclass(frozen=True)
class MethodParts:
    """The ``method.parts`` section: each part None (the method's own) or one of :data:`CHOICES`."""

    __pydantic_config__ = STRICT
    augmentation: str | None = None
    encoder: str | None = None
    extraction: str | None = None
    similarity: str | None = None
    loss: str | None = None

    def __post_init__(self):
        for part in PART_NAMES:
            value = getattr(self, part)
            if value is not None and value not in CHOICES[part]:
                raise ConfigError(f"method.parts.{part} {value!r} is unknown: use one of "
                                  f"{', '.join(CHOICES[part])} (or leave it out for the method's own)")

    def is_default(self) -> bool:
        return all(getattr(self, part) is None for part in PART_NAMES)

    def given(self) -> dict:
        return {part: getattr(self, part) for part in PART_NAMES if getattr(self, part) is not None}


def _parts(augmentation, encoder, extraction, similarity, loss) -> MethodParts:
    return MethodParts(augmentation=augmentation, encoder=encoder, extraction=extraction, similarity=similarity,
                       loss=loss)


#: Each method's own five parts (the framework paper's tables in docs/methods.md).
DEFAULT_PARTS = {
    "simclr": _parts("views", "backbone", "global", "cosine", "nce"),
    "moco_v2": _parts("views", "backbone", "global", "cosine", "nce"),
    "nnclr": _parts("views", "backbone", "global", "predicted_cosine", "nce"),
    "byol": _parts("views", "backbone", "global", "predicted_cosine", "regression"),
    "amdim": _parts("views", "amdim", "multiscale", "dot", "nce"),
    "yadim": _parts("patches", "amdim", "last", "dot", "nce"),
    "cpc_v2": _parts("patches", "amdim", "context", "predicted_dot", "nce"),
}
# The MCL paper's baselines IFM, TS, FD (contrastive.methods.baselines) are SimCLR variants with SimCLR's parts.
DEFAULT_PARTS.update({name: DEFAULT_PARTS["simclr"] for name in ("ifm", "ts", "fd")})
# The dimension-contrastive methods (contrastive.methods.vicreg / barlow, docs/hex.md): VICReg compares the views by
# squared distance and regularises variance and covariance; Barlow Twins drives their cross-correlation to I.
DEFAULT_PARTS.update({"vicreg": _parts("views", "backbone", "global", "squared_distance", "variance_covariance"),
                      "barlow_twins": _parts("views", "backbone", "global", "cross_correlation",
                                             "redundancy_reduction")})
_MAP_EXTRACTIONS = ("multiscale", "last", "last_random", "same_level")
#: What each method lets a user change; a part not listed here is fixed to the method's own.
ALLOWED = {
    "simclr": {"encoder": ("backbone", "amdim")},
    "moco_v2": {"encoder": ("backbone", "amdim")},
    "nnclr": {"encoder": ("backbone", "amdim")},
    "byol": {"encoder": ("backbone", "amdim")},
    "amdim": {"augmentation": ("views", "patches"), "encoder": ("amdim", "backbone"),
              "extraction": _MAP_EXTRACTIONS},
    "yadim": {"augmentation": ("views", "patches"), "encoder": ("amdim", "backbone"),
              "extraction": _MAP_EXTRACTIONS},
    "cpc_v2": {"encoder": ("amdim", "backbone")},
}


def resolve_parts(*, name: str, parts: MethodParts | dict | None) -> MethodParts:
    """The method's own parts with the user's choices in ``parts``; ConfigError for a combination that does not
    make sense (e.g. BYOL with an NCE loss: BYOL has no negatives; AMDIM's multi-scale extraction on an encoder
    that has no feature maps)."""
    if name not in DEFAULT_PARTS:
        raise ConfigError(f"method.name {name!r} is unknown: use one of {', '.join(DEFAULT_PARTS)}")
    if isinstance(parts, dict):
        parts = MethodParts(**parts)
    parts = parts or MethodParts()
    own = DEFAULT_PARTS[name]
    for part, value in parts.given().items():
        allowed = ALLOWED.get(name, {}).get(part, (getattr(own, part),))
        if value not in allowed:
            if len(allowed) == 1:
                having = [m for m, p in DEFAULT_PARTS.items() if getattr(p, part) == value]
                raise ConfigError(f"method.parts.{part}={value} does not combine with method {name}: its "
                                  f"{part} is fixed to {allowed[0]} (the method is defined with it); "
                                  f"drop method.parts.{part} or choose a method whose {part} is {value} "
                                  f"({', '.join(having) or 'none'})")
            raise ConfigError(f"method.parts.{part}={value} does not combine with method {name}: use one of "
                              f"{', '.join(allowed)}")
    resolved = replace(own, **parts.given())
    if resolved.encoder == "backbone" and resolved.extraction in ("multiscale", "last_random", "same_level"):
        raise ConfigError(f"method.parts.extraction={resolved.extraction} compares feature maps at several "
                          "scales, which only the amdim encoder returns: set method.parts.encoder=amdim, or "
                          "method.parts.extraction=last to compare the backbone's pooled vectors")
    return resolved


def check_method_config(*, name: str, parts: MethodParts | dict | None, hex_enabled: bool) -> MethodParts:
    """Config-time checks of a method section: the parts combine, and HEX is only asked of methods whose negatives
    it can reweight."""
    resolved = resolve_parts(name=name, parts=parts)
    if hex_enabled and name in ZOO_METHODS:
        why = "BYOL has no negatives" if name == "byol" else \
            "its negatives are feature-map locations, not the samples HEX's hierarchy is defined on"
        raise ConfigError(f"method.hex.enabled does not combine with method {name} ({why}): set "
                          "method.hex.enabled=false, or use simclr, moco_v2 or nnclr with HEX")
    return resolved


def check_encoder_fits(*, parts: MethodParts, model_encoder: str) -> None:
    """A ViT takes whole images of one fixed size, so it cannot encode CPC's / YADIM's patches."""
    if parts.augmentation == "patches" and parts.encoder == "backbone" and model_encoder.startswith("vit_"):
        raise ConfigError(f"model.encoder {model_encoder} cannot encode patches (a ViT takes images of one fixed "
                          "size): set method.parts.encoder=amdim, or model.encoder to small_cnn or a resnet")


def parts_in_use(*, name: str, sections: dict) -> dict:
    """The zoo's settings that change training, for content keys: ``parts`` only when the user changed a part, and
    each of byol / amdim / cpc / patches only when the resolved parts use it. A SimCLR, MoCo-v2 or NNCLR config
    that leaves them out adds nothing, so its keys are what they were before these sections existed."""
    parts = MethodParts(**(sections.get("parts") or {}))
    resolved = resolve_parts(name=name, parts=parts)
    used = {}
    if not parts.is_default():
        used["parts"] = parts.given()
    if name == "byol":
        used["byol"] = sections["byol"]
    if resolved.encoder == "amdim" or resolved.similarity == "dot":
        used["amdim"] = sections["amdim"]
    if name == "cpc_v2":
        used["cpc"] = sections["cpc"]
    if resolved.augmentation == "patches":
        used["patches"] = sections["patches"]
    return used


# ---------------------------------------------------------------------------------------------------- patches
@dataclass(frozen=True)
class PatchSettings:
    """The ``method.patches`` section: CPC's patch transform a'. The paper cuts a 256 px image into 64 px patches
    with a 32 px stride (7 x 7 patches); the defaults scale that down for 32 px images (16 px patches, stride 8:
    3 x 3 patches). With the amdim encoder the patch side must be one it takes (16, 32, 64 or 128)."""

    __pydantic_config__ = STRICT
    size: int = 16
    stride: int = 8

    def __post_init__(self):
        if self.size < 2 or not 1 <= self.stride <= self.size:
            raise ConfigError(f"method.patches needs size >= 2 and 1 <= stride <= size (got size={self.size}, "
                              f"stride={self.stride}); the paper uses size=64 stride=32 on 256 px images")

    def grid(self, side: int) -> int:
        """Patches per row (and column) of a side x side image."""
        if side < self.size:
            raise ConfigError(f"method.patches.size={self.size} is larger than the {side} px images: set "
                              f"method.patches.size to at most {side} (and stride to about half of it)")
        return (side - self.size) // self.stride + 1


def cut_patches(images: torch.Tensor, *, size: int, stride: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, P, P, C, size, size): the overlapping patches, row-major (row i, column j at [:, i, j]);
    P = (H - size) // stride + 1 (square images). Pixels past the last full patch are not used, as in CPC."""
    if images.shape[-1] != images.shape[-2]:
        raise ConfigError(f"patches need square images, got {tuple(images.shape[-2:])}: resize the data")
    patches = images.unfold(2, size, stride).unfold(3, size, stride)  # (B, C, P, P, size, size)
    return patches.permute(0, 2, 3, 1, 4, 5).contiguous()



def check_parts_fit_data(*, method: dict, model_encoder: str, image_size: int) -> None:
    """Checks that need the data's image side, run when the pipeline config is validated (before any compute):
    patches fit in the images (and CPC gets at least two rows of them), and the amdim encoder's input side is one
    it takes and is the side it will receive. ``method``: the ``method`` section as JSON."""
    from contrastive.models.amdim_encoder import SIDES
    parts = check_method_config(name=method["name"], parts=method.get("parts"),
                                hex_enabled=bool((method.get("hex") or {}).get("enabled", False)))
    check_encoder_fits(parts=parts, model_encoder=model_encoder)
    amdim_side = (method.get("amdim") or {}).get("image_size", 32)
    if parts.augmentation == "patches":
        patches = PatchSettings(**(method.get("patches") or {}))
        grid = patches.grid(image_size)
        if parts.extraction == "context" and grid < 2:
            raise ConfigError(f"CPC predicts rows of patches below from rows above, but {patches.size} px patches "
                              f"with stride {patches.stride} give one row on {image_size} px images: lower "
                              f"method.patches.size or method.patches.stride (e.g. size={image_size // 2}, "
                              f"stride={max(1, image_size // 4)})")
        if parts.encoder == "amdim" and patches.size not in SIDES:
            raise ConfigError(f"the amdim encoder takes {', '.join(map(str, SIDES))} px inputs but "
                              f"method.patches.size is {patches.size}: set it to one of them")
    elif parts.encoder == "amdim" and amdim_side != image_size:
        hint = f"--set method.amdim.image_size={image_size}" if image_size in SIDES else \
            f"resize the data to one of {', '.join(map(str, SIDES))} px"
        raise ConfigError(f"the amdim encoder is built for method.amdim.image_size={amdim_side} px but the data are "
                          f"{image_size} px: {hint}")
