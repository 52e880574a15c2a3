"""README.md and docs/*.md name only what exists: relative links (and their #anchors; BENCHMARKS.md's and
CHANGELOG.md's links too), sections named in prose, presets, `make` targets, `mclpipe` commands and config keys (in
`key=value` and alone in a code span); every table marked ``<!-- table: FILE VIEW -->`` and every figure marked
``<!-- figure: FILE VIEW -->`` equals what ``python -m scripts.render_tables`` renders from that JSON file; and no
run time is typed by hand (a duration in minutes or hours outside a figure mark). Fast, no network: the docs are
read as text.

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
#: the records beside them, whose links (into docs/, between each other) are checked too
RECORDS = [ROOT / "BENCHMARKS.md", ROOT / "CHANGELOG.md"]

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
#: a code span that is a dotted name alone (`model.extra`): a config key when its first part is a config section
BARE_KEY = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)+)$")
FILE_SUFFIX = re.compile(r"\.(?:json|jsonl|yaml|yml|py|npy|npz|md|pt|csv|txt|png|tar|log|whl|sh|cff|toml|safetensors)$")
#: a run time typed in prose: 3 minutes, 14 min, 1.5-2 min, 2 h (durations in seconds are settings as often)
TYPED_TIME = re.compile(r"(?<![\w.-])~?\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?(?:min|minutes|h|hours)\b")
FIGURE_MARK = re.compile(r"<!-- figure: [^>]*-->[^\n]*?<!-- /figure -->")
#: a section named in prose after its file: [x](file.md) ("Title"), file.md, "Title", file.md's "Title"
NAMED_SECTION = [re.compile(r"\]\((?P<file>[\w./-]+\.md)\)[ ,]*\(\"(?P<title>[^\"\n]{3,100})\""),
                 re.compile(r"(?<![\w/.(])(?P<file>[\w./-]+\.md)(?:,|'s|:)? (?:section )?\"(?P<title>[^\"\n]{3,100})\"")]


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


def section_problems(doc: Path) -> list[str]:
    """Sections named in prose by their title after their file (``[results.md](results.md) ("Reading the
    tables")``, ``BENCHMARKS.md, "Image input per core"``) that the file has no heading for (the title is a
    heading's start: BENCHMARKS.md's headings go on with their workload)."""
    problems = []
    prose = FENCE.sub("", doc.read_text())
    for pattern in NAMED_SECTION:
        for match in pattern.finditer(prose):
            path = (doc.parent / match["file"]).resolve()
            if not path.exists():
                path = (ROOT / Path(match["file"]).name).resolve()  # "BENCHMARKS.md" named from docs/
            if path.exists() and not any(anchor.startswith(slug(match["title"])) for anchor in anchors_of(path)):
                problems.append(f"{doc.name}: section \"{match['title']}\" of {match['file']}: no such heading")
    return problems


def time_problems(doc: Path) -> list[str]:
    """Run times typed in prose: a duration in minutes or hours outside code and outside a figure mark (render it
    from the file its command writes, ``<!-- figure: FILE wall -->``, or leave it to BENCHMARKS.md)."""
    text = FIGURE_MARK.sub("", FENCE.sub("", doc.read_text()))
    text = INLINE.sub("", text)
    return [f"{doc.name}: typed run time {m.group(0).strip()!r}: render it from the file its command writes "
            f"(<!-- figure: FILE wall -->) or leave it to BENCHMARKS.md" for m in TYPED_TIME.finditer(text)]


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
    """Config keys written with ``=`` anywhere in code, or alone in a code span (`mcl.clusters`) when their first
    part is a section of some pipeline's config (`tasks.steps` or `model.pt` are not keys)."""
    text = doc.read_text()
    sections = {name for cls in classes for name in cls.model_fields}
    named = set(KEY.findall(code_of(text)))
    named |= {m[1] for span in INLINE.findall(FENCE.sub("", text)) if (m := BARE_KEY.match(span.strip()))
              and m[1].split(".")[0] in sections and not FILE_SUFFIX.search(m[1])}
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
    assert [p for doc in [*DOCS, *RECORDS] for p in link_problems(doc)] == []


def test_sections_named_in_prose_exist():
    assert [p for doc in [*DOCS, *RECORDS] for p in section_problems(doc)] == []


def test_no_run_time_is_typed_by_hand():
    assert [p for doc in DOCS for p in time_problems(doc)] == []


def test_every_figure_has_its_fields():
    """A figure whose file was written before its fields existed renders empty; this says which until the command
    that writes the file runs again (docs/results.md names the commands)."""
    from scripts.render_tables import missing_figures
    missing = [f"{doc.name}: {m}" for doc in DOCS for m in missing_figures(doc.read_text())]
    if missing:
        pytest.skip("figures not rendered until their files are written again: " + "; ".join(missing))
    assert missing == []


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


def test_readme_quick_start_gives_the_two_commands():
    """The README's first code block holds the two commands a new user runs: the main job and the test suite that
    CI (.ci/run) calls, each at the start of its line."""
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick_start.strip().splitlines()]
    assert commands == ["make run", "make test"]
    assert "\nphase \"make test\" make test\n" in (ROOT / ".ci" / "run").read_text()


# ------------------------------------------------------------------------------ each check fails on its mistake
def test_planted_broken_link_fails(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## The part\n")
    doc = tmp_path / "README.md"
    doc.write_text("[ok](docs/a.md) [ok](docs/a.md#the-part) [gone](docs/b.md) [no anchor](docs/a.md#nothing)\n")
    assert link_problems(doc) == ["README.md: link to docs/b.md: no such file",
                                  "README.md: link to docs/a.md#nothing: no heading with that anchor in a.md"]


def test_planted_broken_link_into_and_out_of_the_records_fails(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n[ok](../BENCHMARKS.md#k-means) [gone](../BENCHMARKS.md#k-mean)\n")
    (tmp_path / "BENCHMARKS.md").write_text("# Benchmarks\n\n## k-means\n\n[ok](docs/a.md) [gone](docs/b.md)\n"
                                            "[changes](CHANGELOG.md#020---2026-11-28) [no](CHANGELOG.md#020)\n")
    (tmp_path / "CHANGELOG.md").write_text("# Changelog\n\n## [0.2.0] - 2026-11-28\n")
    assert link_problems(tmp_path / "docs" / "a.md") == [
        "a.md: link to ../BENCHMARKS.md#k-mean: no heading with that anchor in BENCHMARKS.md"]
    assert link_problems(tmp_path / "BENCHMARKS.md") == [
        "BENCHMARKS.md: link to docs/b.md: no such file",
        "BENCHMARKS.md: link to CHANGELOG.md#020: no heading with that anchor in CHANGELOG.md"]


def test_planted_wrong_section_in_prose_fails(tmp_path):
    (tmp_path / "results.md").write_text("# Results\n\n## Reading the tables\n\n## Image input per core: JPEGs\n")
    doc = tmp_path / "mcl.md"
    doc.write_text('Why: [results.md](results.md) ("Reading the tables"); results.md, "Image input per core".\n'
                   'Gone: [results.md](results.md) ("The tables `make run` prints"), results.md\'s "Over 5 seeds".\n')
    assert section_problems(doc) == [
        'mcl.md: section "The tables `make run` prints" of results.md: no such heading',
        'mcl.md: section "Over 5 seeds" of results.md: no such heading']


def test_planted_stale_time_fails(tmp_path):
    from scripts.render_tables import rendered
    data = tmp_path / "reproduce.json"
    data.write_text('{"wall_seconds": 845.3, "steps": {"computed": 36, "reused": 0}, '
                    '"machine": {"cpu": "AMD EPYC", "cores": 2, "gpu": null, "load_average": [1.0, 2.0]}}')
    fresh = "14.1 min on a 2-core AMD EPYC"
    doc = tmp_path / "README.md"
    doc.write_text(f"Over 3 seeds (`make reproduce`, <!-- figure: reproduce.json wall -->{fresh}<!-- /figure -->).\n")
    assert time_problems(doc) == [] and rendered(doc.read_text(), tmp_path)[1] == []
    doc.write_text(f"Over 3 seeds (`make reproduce`, <!-- figure: reproduce.json wall -->12.0 min on a 2-core AMD "
                   f"EPYC<!-- /figure -->).\n")
    assert rendered(doc.read_text(), tmp_path)[1] == ["reproduce.json wall"]
    doc.write_text("Over 3 seeds (`make reproduce`, 14 min; it takes about 3 minutes a seed).\n")
    assert [p.split(":")[1] for p in time_problems(doc)] == [" typed run time '14 min'",
                                                             " typed run time '3 minutes'"]


def test_a_figure_from_an_older_file_renders_empty_and_is_named(tmp_path):
    from scripts.render_tables import missing_figures, rendered
    (tmp_path / "reproduce.json").write_text('{"wall_seconds": 845.3, "seeds": [0, 1, 2], '
                                             '"per_seed": [{"MCL concat": {"probe/shape": 0.5555}}]}')
    text = ("(<!-- figure: reproduce.json wall --><!-- /figure -->) seeds <!-- figure: reproduce.json seeds -->"
            "0, 1 and 2<!-- /figure -->: <!-- figure: reproduce.json per_seed probe/shape MCL concat -->0.555"
            "<!-- /figure -->\n")
    assert rendered(text, tmp_path) == (text, [])  # 0.5555 rounds as the tables round it, not to 0.556
    assert missing_figures(text, tmp_path) == ["reproduce.json wall: no steps, machine"]


def test_a_sweeps_comparison_csv_renders_as_its_table(tmp_path):
    from scripts.render_tables import render
    data = tmp_path / "comparison.csv"
    data.write_text("mcl.clusters,representation,attribute,mean,std,n,values\n"
                    "4,stage 0,color,0.99934,0.00092,3,x\n4,stage 0,shape,0.2421875,0.0141,3,x\n"
                    "16,MCL concat,shape,0.26,0.006,3,x\n")
    assert render(data, "sweep") == ("| mcl.clusters | representation | color | shape |\n|---|---|---|---|\n"
                                     "| 4 | stage 0 | 0.999 ± 0.001 | 0.242 ± 0.014 |\n"
                                     "| 16 | MCL concat | - | 0.260 ± 0.006 |\n")


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


def test_planted_unknown_key_without_equals_fails(tmp_path):
    doc = tmp_path / "operating.md"
    doc.write_text("Set `model.extra` or `mcl.clusters`; `tasks.steps`, `model.pt` and `summary.json` are no keys.\n")
    assert key_problems(doc, config_classes()) == [
        "operating.md: config key 'model.extra' is in no pipeline's schema (`mclpipe show-config` lists them)"]


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
