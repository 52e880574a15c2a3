"""The MCL paper's feature-suppression baselines as methods of the same pipeline: IFM, TS and FD (Table 2), each a
SimCLR variant trained by the one engine and evaluated with the same probes (run them with mcl.num_stages=1)."""
from __future__ import annotations

from torch import nn

from contrastive.errors import ConfigError
from contrastive.methods.base import ContrastiveMethod
from contrastive.methods.feature_dropout import FdSettings, FdSimCLR
from contrastive.methods.ifm import IfmSettings, IfmSimCLR
from contrastive.methods.temperature_schedule import TsSettings, TsSimCLR

BASELINES = ("ifm", "ts", "fd")


def build_baseline(*, name: str, backbone: nn.Module, head: nn.Module, in_channels: int,
                   method_kwargs: dict) -> ContrastiveMethod:
    """The baseline ``name`` on a fresh backbone and head; method_kwargs: the config's method section as JSON
    (temperature, ifm, ts, fd; missing sections take their defaults)."""
    if (method_kwargs.get("hex") or {}).get("enabled"):
        raise ConfigError(f"method.name {name} is a baseline of plain SimCLR: switch HEX off (method.hex.enabled="
                          "false) or use method.name=simclr")
    if name == "ifm":
        return IfmSimCLR(backbone=backbone, head=head, temperature=method_kwargs["temperature"],
                         settings=IfmSettings(**(method_kwargs.get("ifm") or {})))
    if name == "ts":
        return TsSimCLR(backbone=backbone, head=head, settings=TsSettings(**(method_kwargs.get("ts") or {})))
    if name == "fd":
        return FdSimCLR(backbone=backbone, head=head, temperature=method_kwargs["temperature"],
                        channels=in_channels, settings=FdSettings(**(method_kwargs.get("fd") or {})))
    raise ValueError(f"unknown baseline {name!r}: use one of {', '.join(BASELINES)}")
