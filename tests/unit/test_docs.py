"""README.md and docs/*.md name only what exists: relative links (and their #anchors), presets, `make` targets,
`mclpipe` commands and config keys; and every table marked ``<!-- table: FILE VIEW -->`` equals what
``python -m scripts.render_tables`` renders from that JSON file. Fast, no network: the docs are read as text.

Commands, targets and keys are read from code only (fenced blocks and inline code spans), where a reader copies
them from; prose may say "make sure" without naming a target. Each checker returns its problems as lines, and the
``planted`` tests show each one fails on the mistake it exists for.
"""
from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
#: where a shell command starts: a line (or code span), or after ; && | ( $( ; optionally `time` and VAR=value
START = r"(?:^[ \t]*|[;&|(][ \t]*|\$\(?[ \t]*)(?:(?:time|sudo|[A-Z_]+=\S*)[ \t]+)*"
MAKE = re.compile(START + r"make[ \t]+([a-z][\w-]*)", re.M)
MCLPIPE = re.compile(START + r"(?:[\w./~-]*/)?mclpipe[ \t]+([a-z][\w-]*)", re.M)
#: `mclpipe <command> <preset>` where the command takes a config; `presets/<name>.yaml`; `models:/<name>@`
PRESET_USES = [re.compile(r"mclpipe[ \t]+(?:run|reproduce|sweep|results|show-config|serve|deploy)[ \t]+"
                          r"([a-z][a-z0-9_]*)\b(?![./])"),
               re.compile(r"presets/([a-z][a-z0-9_]*)\.yaml"),
               re.compile(r"models:/([a-z][a-z0-9_]*)@")]
#: a dotted config key before "=": `--set train.epochs=2`, `--grid mcl.clusters=...`, `stage_overrides.1.train.lr=`
KEY = re.compile(r"(?<![\w.:/$-])([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)+)=(?!=)")


def code_of(text: str) -> str:
    """The code a document shows: its fenced blocks and inline code spans, one per line."""
    blocks = FENCE.findall(text)
    prose = FENCE.sub("", text)
    return "\n".join([*blocks, *INLINE.findall(prose)])


# ---------------------------------------------------------------------------------------------------- links
def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, code marks and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def link_problems(doc: Path) -> list[str]:
    """Relative links of ``doc`` whose file, or whose #anchor in a markdown file, does not exist."""
    problems = []
    for target in LINK.findall(FENCE.sub("", doc.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if not path.exists():
            problems.append(f"{doc.name}: link to {target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors_of(path):
            problems.append(f"{doc.name}: link to {target}: no heading with that anchor in {path.name}")
    return problems


# ---------------------------------------------------------------------------------------------------- names
def preset_problems(doc: Path, presets: set[str]) -> list[str]:
    code = code_of(doc.read_text())
    named = {m for pattern in PRESET_USES for m in pattern.findall(code)}
    return [f"{doc.name}: preset {name!r} does not exist (pipeline_config/presets)" for name in sorted(named - presets)]


def make_targets(makefile: Path) -> set[str]:
    return set(re.findall(r"^([a-zA-Z][\w-]*)\s*:(?!=)", makefile.read_text(), re.M))


def make_problems(doc: Path, targets: set[str]) -> list[str]:
    named = set(MAKE.findall(code_of(doc.read_text())))
    return [f"{doc.name}: `make {t}` is not a Makefile target" for t in sorted(named - targets)]


def cli_commands() -> set[str]:
    import typer.main

    from flows.cli import app
    return set(typer.main.get_command(app).commands)


def command_problems(doc: Path, commands: set[str]) -> list[str]:
    named = set(MCLPIPE.findall(code_of(doc.read_text())))
    return [f"{doc.name}: `mclpipe {c}` is not a command of mclpipe" for c in sorted(named - commands)]


def _resolves(annotation, parts: list[str]) -> bool:
    """Whether the dotted ``parts`` name a key inside a field typed ``annotation`` (a section, a dict of
    sections keyed by stage, a union of them, or a free mapping)."""
    from pydantic import BaseModel
    if not parts:
        return True
    if annotation is typing.Any:
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is dict or annotation is dict:
        return not args or _resolves(args[1], parts[1:])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(parts[0])
        return field is not None and _resolves(field.annotation, parts[1:])
    if dataclasses.is_dataclass(annotation):  # the library's settings (HexSettings, AmdimSettings, ...)
        hints = typing.get_type_hints(annotation)
        return parts[0] in hints and _resolves(hints[parts[0]], parts[1:])
    return any(_resolves(arg, parts) for arg in args if arg is not type(None))


def config_classes() -> list[type]:
    from contrastive.modalities.registry import keys
    from pipeline_config.schema import config_class
    return [config_class(key) for key in keys()]


def key_problems(doc: Path, classes: list[type]) -> list[str]:
    named = set(KEY.findall(code_of(doc.read_text())))
    return [f"{doc.name}: config key {key!r} is in no pipeline's schema (`mclpipe show-config` lists them)"
            for key in sorted(named) if not any(_resolves(cls, key.split(".")) for cls in classes)]


# ---------------------------------------------------------------------------------------------------- tables
def table_problems(doc: Path, root: Path = ROOT) -> list[str]:
    from scripts.render_tables import rendered
    try:
        _, stale = rendered(doc.read_text(), root)
    except (OSError, ValueError, KeyError) as exc:
        return [f"{doc.name}: a marked table cannot be rendered: {exc}"]
    return [f"{doc.name}: the table of {mark} differs from its file: run `python -m scripts.render_tables`"
            for mark in stale]


# ---------------------------------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def presets() -> set[str]:
    from pipeline_config.loader import preset_names
    return set(preset_names())


def test_relative_links_resolve():
    assert [p for doc in DOCS for p in link_problems(doc)] == []


def test_named_presets_exist(presets):
    assert [p for doc in DOCS for p in preset_problems(doc, presets)] == []


def test_make_targets_exist():
    targets = make_targets(ROOT / "Makefile")
    assert [p for doc in DOCS for p in make_problems(doc, targets)] == []


def test_mclpipe_commands_exist():
    commands = cli_commands()
    assert [p for doc in DOCS for p in command_problems(doc, commands)] == []


def test_config_keys_exist():
    classes = config_classes()
    assert [p for doc in DOCS for p in key_problems(doc, classes)] == []


def test_rendered_tables_match_their_files():
    assert [p for doc in DOCS for p in table_problems(doc)] == []


def test_readme_has_marked_tables():
    """The README's results table is a rendered one (a marker removed would let its numbers drift unchecked)."""
    assert len(re.findall(r"<!-- table: ", (ROOT / "README.md").read_text())) >= 1


# ------------------------------------------------------------------------------ each check fails on its mistake
def test_planted_broken_link_fails(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## The part\n")
    doc = tmp_path / "README.md"
    doc.write_text("[ok](docs/a.md) [ok](docs/a.md#the-part) [gone](docs/b.md) [no anchor](docs/a.md#nothing)\n")
    assert link_problems(doc) == ["README.md: link to docs/b.md: no such file",
                                  "README.md: link to docs/a.md#nothing: no heading with that anchor in a.md"]


def test_planted_renamed_preset_fails(tmp_path, presets):
    doc = tmp_path / "README.md"
    doc.write_text("```bash\nmclpipe run trifeature_quick\nmclpipe run trifeature_fast --set seed=1\n```\n"
                   "Or `make run CONFIG=pipeline_config/presets/trifeature_fastest.yaml`, then load "
                   "`models:/trifeature_quick@current`.\n")
    assert preset_problems(doc, presets) == [
        "README.md: preset 'trifeature_fast' does not exist (pipeline_config/presets)",
        "README.md: preset 'trifeature_fastest' does not exist (pipeline_config/presets)"]


def test_planted_unknown_target_command_and_key_fail(tmp_path):
    doc = tmp_path / "README.md"
    doc.write_text("Run `make tests` or `mclpipe launch x`; prose may make sure of anything.\n\n```\n"
                   "mclpipe run trifeature_quick --set train.epoch=2 --set stage_overrides.1.train.lr=0.1\n```\n")
    assert make_problems(doc, make_targets(ROOT / "Makefile")) == ["README.md: `make tests` is not a Makefile target"]
    assert command_problems(doc, cli_commands()) == ["README.md: `mclpipe launch` is not a command of mclpipe"]
    assert key_problems(doc, config_classes()) == [
        "README.md: config key 'train.epoch' is in no pipeline's schema (`mclpipe show-config` lists them)"]


def test_planted_stale_table_fails(tmp_path):
    data = tmp_path / "summary.json"
    data.write_text('{"results": {"stage 0": {"probe/color": 1.0, "probe/shape": 0.25, "knn/color": 0.9}}}')
    fresh = "| representation | color | shape |\n|---|---|---|\n| stage 0 | 1.000 | 0.250 |\n"
    doc = tmp_path / "README.md"
    doc.write_text(f"<!-- table: summary.json probe -->\n{fresh}<!-- /table -->\n")
    assert table_problems(doc, tmp_path) == []
    doc.write_text(f"<!-- table: summary.json probe -->\n{fresh.replace('0.250', '0.350')}<!-- /table -->\n")
    assert table_problems(doc, tmp_path) == [
        "README.md: the table of summary.json probe differs from its file: run `python -m scripts.render_tables`"]


def test_seeds_table_renders_as_reproduce_prints_it(tmp_path):
    from scripts.render_tables import render
    data = tmp_path / "reproduce.json"
    data.write_text('{"mean_std": {"MCL concat": {"color": [1.0, 0.0], "shape": [0.5431, 0.0642]}}}')
    assert render(data, "mean_std") == ("| representation | color | shape |\n|---|---|---|\n"
                                        "| MCL concat | 1.000 ± 0.000 | 0.543 ± 0.064 |\n")
