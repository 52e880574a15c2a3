"""Load a pipeline config (the class its ``pipeline:`` key names) from YAML plus ``--set a.b=c`` overrides, with one-line errors that name the fix."""
from __future__ import annotations

import difflib
import re
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from contrastive.errors import ConfigError
from pipeline_config.schema import _PipelineBase, config_class

PRESETS_PACKAGE = "pipeline_config.presets"


class ConfigYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader without YAML 1.1's base-60 numbers: ``time_limit: 1:00:00`` stays the string Slurm
    reads as one hour, where ``yaml.safe_load`` made it the int 3600 (3600 minutes to Slurm); ``90:00`` stays a
    string too. Every other scalar resolves as with ``yaml.safe_load``."""


_SEXAGESIMAL = {"tag:yaml.org,2002:int": "|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+",
                "tag:yaml.org,2002:float": "|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\\.[0-9_]*"}
ConfigYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, re.compile(regexp.pattern.replace(_SEXAGESIMAL[tag], ""), regexp.flags) if tag in _SEXAGESIMAL
             else regexp) for tag, regexp in resolvers]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def load_yaml(text: str) -> Any:
    """A config file's or an override's YAML (:class:`ConfigYamlLoader`)."""
    return yaml.load(text, Loader=ConfigYamlLoader)  # noqa: S506 (a SafeLoader subclass)


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
    guess = difflib.get_close_matches(path.name.removesuffix(".yaml"), preset_names(), n=1)
    hint = f"did you mean {guess[0]!r}? " if guess else ""
    raise ConfigError(f"config file {str(name_or_path)!r} not found: {hint}give a YAML path or one of the presets "
                      f"{', '.join(preset_names())}")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=c`` -> (["a", "b"], yaml-parsed c). Values are YAML: 3, 0.5, true, [64, 4], null."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key.path=value (e.g. --set train.epochs=2)")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"override {text!r} has an empty key (e.g. --set train.epochs=2)")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc.problem})") from None
    return key.strip().split("."), value


def _existing_key(node: dict, key: str):
    """The key of ``node`` that ``key`` (a part of an override's dotted path, always a string) names: YAML reads
    ``stage_overrides: {1: ...}`` with an int key, which ``stage_overrides.1.train.lr`` must reach rather than
    add a second entry "1" beside it (that entry then replaced the file's, losing its other settings)."""
    if key in node:
        return key
    return next((existing for existing in node if str(existing) == key), key)


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    for text in overrides:
        keys, value = parse_override(text)
        node = raw
        for key in keys[:-1]:
            child = node.setdefault(_existing_key(node, key), {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {key!r} is a value, not a section")
            node = child
        node[_existing_key(node, keys[-1])] = value
    return raw


def _section_model(annotation) -> type[BaseModel] | None:
    """The config section class an annotation holds (``X``, ``X | None``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (model := _section_model(arg)) is not None:
            return model
    return None


def valid_keys(schema: type[BaseModel], path: list[str]) -> list[str]:
    """The keys the section at ``path`` of ``schema`` accepts ([] where the path leaves the typed sections)."""
    model: type[BaseModel] | None = schema
    for part in path:
        field = model.model_fields.get(str(part))
        model = _section_model(field.annotation) if field is not None else None
        if model is None:
            return []
    return list(model.model_fields)


def format_validation_error(exc: ValidationError, schema: type[BaseModel] | None = None) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "config"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            *section, key = [str(p) for p in err["loc"]]
            guess = difflib.get_close_matches(key, valid_keys(schema, section), n=1) if schema else []
            hint = f"did you mean {'.'.join([*section, guess[0]])}? " if guess else "check the spelling; "
            msg = f"unknown key ({hint}`mclpipe show-config` prints every valid key with its description)"
        parts.append(f"{where}: {msg}")
    return "invalid config: " + "; ".join(parts)


def config_schema_for(raw: dict) -> type[_PipelineBase]:
    """The schema named by the top-level ``pipeline`` key (image by default)."""
    return config_class(raw.get("pipeline", "image"))


def config_from_dict(raw: dict) -> _PipelineBase:
    schema = config_schema_for(raw)
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, schema)) from None


def load_config(name_or_path: str | Path, overrides: list[str] | None = None) -> _PipelineBase:
    path = resolve_config_path(name_or_path)
    try:
        raw = load_yaml(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (data:, train:, mcl:, ...)")
    raw.pop("sweep", None)  # the grid `mclpipe sweep` reads (contrastive.sweep.sweep_section); not a pipeline's
    return config_from_dict(apply_overrides(raw, overrides or []))


def dump_config(config: _PipelineBase) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def _flow_yaml(key: str, value: Any) -> str:
    """``key: value`` on one line (lists and mappings in YAML flow style)."""
    return yaml.safe_dump({key: value}, default_flow_style=True, sort_keys=False, width=10**6).strip()[1:-1]


def described_config(config: BaseModel) -> str:
    """The config as YAML that loads back to it, every key followed by its schema description as a comment, and
    ``[changed; default: X]`` where the value differs from the schema's default (what ``mclpipe show-config``
    prints)."""
    try:
        default = type(config).model_validate({"pipeline": getattr(config, "pipeline", "image")})
    except ValidationError:
        default = None
    return "\n".join(_described_lines(config, default, indent="")) + "\n"


def _described_lines(section: BaseModel, default: BaseModel | None, *, indent: str) -> list[str]:
    lines = []
    values = section.model_dump(mode="json")
    defaults = default.model_dump(mode="json") if default is not None else {}
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        description = " ".join((field.description or "").split())
        if isinstance(value, BaseModel):
            lines.append(f"{indent}{name}:" + (f"  # {description}" if description else ""))
            lines += _described_lines(value, getattr(default, name, None), indent=indent + "  ")
            continue
        notes = []
        if default is not None and name in defaults and values[name] != defaults[name]:
            notes.append(f"[changed; default: {_flow_yaml('x', defaults[name])[3:]}]")
        if description:
            notes.append(description)
        lines.append(f"{indent}{_flow_yaml(name, values[name])}" + (f"  # {' '.join(notes)}" if notes else ""))
    return lines
