from __future__ import annotations

from contrastive.methods.base import ContrastiveMethod
from contrastive.methods.simclr import SimCLR
from contrastive.models import build_model


def build_method(*, model_kwargs: dict, method_kwargs: dict) -> ContrastiveMethod:
    """A fresh method instance: model_kwargs go to ``build_model`` (encoder, widths, projection sizes);
    method_kwargs are the config's ``method`` section (name, temperature, ...)."""
    kwargs = dict(method_kwargs)
    name = kwargs.pop("name")
    model = build_model(**model_kwargs)
    if name == "simclr":
        return SimCLR(backbone=model.backbone, head=model.head, temperature=kwargs["temperature"])
    raise ValueError(f"unknown method {name!r}")
