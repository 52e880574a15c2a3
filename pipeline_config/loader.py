"""Load a PipelineConfig from YAML plus ``--set a.b=c`` overrides, with one-line errors that name the fix."""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from contrastive.errors import ConfigError
from pipeline_config.schema import PipelineConfig

PRESETS_PACKAGE = "pipeline_config.presets"


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files(PRESETS_PACKAGE).iterdir()
                  if p.name.endswith(".yaml"))


def resolve_config_path(name_or_path: str | Path) -> Path:
    """A path to a YAML file, or the name of a bundled preset (``trifeature_mcl``)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    preset = resources.files(PRESETS_PACKAGE) / f"{path.name.removesuffix('.yaml')}.yaml"
    if preset.is_file():
        return Path(str(preset))
    raise ConfigError(f"config file {str(name_or_path)!r} not found: give a YAML path or one of the presets "
                      f"{', '.join(preset_names())}")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=c`` -> (["a", "b"], yaml-parsed c). Values are YAML: 3, 0.5, true, [64, 4], null."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key.path=value (e.g. --set train.epochs=2)")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"override {text!r} has an empty key (e.g. --set train.epochs=2)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc.problem})") from None
    return key.strip().split("."), value


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    for text in overrides:
        keys, value = parse_override(text)
        node = raw
        for key in keys[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {key!r} is a value, not a section")
            node = child
        node[keys[-1]] = value
    return raw


def format_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "config"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; `mclpipe show-config` prints every valid key)"
        parts.append(f"{where}: {msg}")
    return "invalid config: " + "; ".join(parts)


def config_schema_for(raw: dict):
    """The schema named by the top-level ``pipeline`` key (mcl by default)."""
    kind = raw.get("pipeline", "mcl")
    if kind == "clip":
        from pipeline_config.schema import ClipPipelineConfig
        return ClipPipelineConfig
    if kind == "text":
        from pipeline_config.text import TextPipelineConfig
        return TextPipelineConfig
    if kind != "mcl":
        raise ConfigError(f"pipeline: {kind!r} is not a pipeline kind; use mcl, clip or text")
    return PipelineConfig


def config_from_dict(raw: dict) -> PipelineConfig:
    try:
        return config_schema_for(raw).model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def load_config(name_or_path: str | Path, overrides: list[str] | None = None) -> PipelineConfig:
    path = resolve_config_path(name_or_path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (data:, train:, mcl:, ...)")
    raw.pop("sweep", None)  # the grid `mclpipe sweep` reads (contrastive.sweep.sweep_section); not a pipeline's
    return config_from_dict(apply_overrides(raw, overrides or []))


def dump_config(config: PipelineConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
