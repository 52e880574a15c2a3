"""YADIM (framework paper, section 3.3): AMDIM's and CPC's choices recombined, and the paper's ablation of
representation extraction strategies (its Table 2) as ``method.parts.extraction`` values.

YADIM is :class:`contrastive.methods.amdim.FeatureMapNCE` with its own parts:
(1) augmentation: the union of AMDIM's pipeline (random flip, image jitter, colour jitter, random grayscale; the
    ``augment`` section, :data:`AMDIM_AUGMENT`) and CPC's patch transform (``patches``, ``method.patches``);
(2) encoder: AMDIM's (``amdim``); (3) extraction: the last feature maps only, (-1 : -1) (``last``);
(4) similarity: dot product without extra parameters (``dot``); (5) loss: NCE (``nce``).
"""
from __future__ import annotations

from contrastive.methods.amdim import FeatureMapNCE
from contrastive.methods.parts import DEFAULT_PARTS

YADIM = FeatureMapNCE
YADIM_PARTS = DEFAULT_PARTS["yadim"]

#: AMDIM's augmentation pipeline as this project's ``augment`` section (the released AMDIM transforms:
#: RandomResizedCrop scale (0.3, 1) ratio (0.7, 1.4), horizontal flip, ColorJitter(0.4, 0.4, 0.4, 0.2) with
#: p = 0.8, RandomGrayscale p = 0.25). Its last stage, z-normalisation, is left to the encoder's batch-normalised
#: embeddings. On Trifeature colour jitter and grayscale remove the colour attribute from what the views share.
AMDIM_AUGMENT = {"crop_scale": (0.3, 1.0), "crop_ratio": (0.7, 1.4), "hflip": True, "color_jitter": 0.4,
                 "color_jitter_hue": 0.2, "color_jitter_p": 0.8, "grayscale_p": 0.25}

#: The framework paper's Table 2 (CIFAR-10 accuracy of a 1,024-unit MLP on the frozen encoder; the paper's
#: numbers, not measured here): strategy -> (method.parts.extraction, AMDIM, YADIM).
EXTRACTION_ABLATION = {
    "AMDIM task (-1:-2) + (-1:-3) + (-2:-2)": ("multiscale", 90.00, 92.40),
    "last only (-1:-1)": ("last", 64.00, 91.98),
    "last + random (-1:k)": ("last_random", 79.00, 92.20),
    "same level (-1:-1) + (-2:-2) + (-3:-3)": ("same_level", 82.00, 92.22),
}


def ablation_overrides(method: str = "yadim") -> dict[str, list[str]]:
    """The ``--set`` overrides that run each row of the ablation for ``method`` (amdim or yadim)."""
    if method not in ("amdim", "yadim"):
        raise ValueError(f"the extraction ablation compares amdim and yadim, not {method!r}")
    return {row: [f"method.name={method}", f"method.parts.extraction={extraction}"]
            for row, (extraction, _, _) in EXTRACTION_ABLATION.items()}
