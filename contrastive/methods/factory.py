from __future__ import annotations

from contrastive.methods.hex import HexRule
from contrastive.methods.base import ContrastiveMethod
from contrastive.methods.baselines import BASELINES, build_baseline
from contrastive.methods.barlow import BarlowSettings, BarlowTwins
from contrastive.methods.moco import MoCoV2, MocoSettings
from contrastive.methods.nnclr import NNCLR, NnclrSettings
from contrastive.methods.simclr import SimCLR
from contrastive.methods.vicreg import VICReg, VicregSettings
from contrastive.methods.zoo import build_zoo_method, with_encoder_part
from contrastive.models import ProjectionHead, build_model

METHODS = ("simclr", "moco_v2", "nnclr", "byol", "amdim", "cpc_v2", "yadim", *BASELINES, "vicreg", "barlow_twins")


def build_method(*, model_kwargs: dict, method_kwargs: dict) -> ContrastiveMethod:
    """A fresh method instance: model_kwargs go to ``build_model`` (encoder, widths, projection sizes);
    method_kwargs are the config's ``method`` section as JSON (name, temperature, hex, moco, nnclr). Sections a
    method does not use are ignored; missing ones take the schema's defaults (models saved before they existed
    still load)."""
    kwargs = dict(method_kwargs)
    name = kwargs.pop("name")
    model = build_model(**model_kwargs)
    if name in ("byol", "amdim", "cpc_v2", "yadim"):  # built from their five parts (contrastive.methods.zoo)
        return build_zoo_method(name=name, model=model, model_kwargs=model_kwargs, method_kwargs=kwargs)
    if name in ("simclr", "moco_v2", "nnclr"):  # method.parts.encoder may swap in AMDIM's encoder
        model = with_encoder_part(name=name, model=model, model_kwargs=model_kwargs, method_kwargs=kwargs)
    if name in BASELINES:  # the MCL paper's IFM, TS and FD (contrastive.methods.baselines)
        return build_baseline(name=name, backbone=model.backbone, head=model.head,
                              in_channels=model_kwargs.get("in_channels", 3), method_kwargs=kwargs)
    hex_rule = HexRule.from_config(kwargs.get("hex"))
    dim = model_kwargs["projection_dim"]
    if name == "simclr":
        return SimCLR(backbone=model.backbone, head=model.head, temperature=kwargs["temperature"], hex_rule=hex_rule,
                      dim=dim)
    if name == "moco_v2":
        moco = MocoSettings(**(kwargs.get("moco") or {}))
        return MoCoV2(backbone=model.backbone, head=model.head, dim=dim, temperature=kwargs["temperature"],
                      queue_size=moco.queue_size, momentum=moco.momentum, hex_rule=hex_rule)
    if name == "nnclr":
        nnclr = NnclrSettings(**(kwargs.get("nnclr") or {}))
        predictor = ProjectionHead(in_dim=dim, hidden_dim=nnclr.predictor_hidden, out_dim=dim)
        return NNCLR(backbone=model.backbone, head=model.head, predictor=predictor, dim=dim,
                     temperature=kwargs["temperature"], queue_size=nnclr.queue_size, hex_rule=hex_rule)
    if name == "vicreg":  # dimension-contrastive (contrastive.methods.vicreg / barlow); HEX as a local term
        return VICReg(backbone=model.backbone, head=model.head, dim=dim,
                      settings=VicregSettings(**(kwargs.get("vicreg") or {})), hex_rule=hex_rule)
    if name == "barlow_twins":
        return BarlowTwins(backbone=model.backbone, head=model.head, dim=dim,
                           settings=BarlowSettings(**(kwargs.get("barlow") or {})), hex_rule=hex_rule)
    raise ValueError(f"unknown method {name!r}: use one of {', '.join(METHODS)}")
