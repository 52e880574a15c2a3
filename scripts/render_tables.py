"""Render the results tables and figures marked in README.md and docs/*.md from the JSON files the commands wrote.

A rendered table sits between two markers naming its file and what of it to show::

    <!-- table: docs/data/trifeature_quick-seed0.summary.json probe -->
    | representation | color | shape | texture |
    ...
    <!-- /table -->

Views: ``sweep`` of the ``comparison.csv`` ``mclpipe sweep`` writes; ``probe``, ``knn`` (or any metric prefix) of a
pipeline's ``summary.json`` (``mclpipe run`` writes it to
``runs/pipelines/<pipeline id>/``; rendered as the pipeline's own results.md renders it), and ``mean_std`` of the
JSON ``mclpipe reproduce`` writes (``runs/reproduce/<name>.json``). Paths are relative to the repository root.

A figure inside a sentence is rendered the same way, between inline marks::

    Over 3 seeds (`make reproduce`<!-- figure: docs/data/trifeature_quick.reproduce.json wall -->...<!-- /figure -->)

Figure views (``FIGURES``): ``wall`` (the wall time, the steps reused when any were, the machine: from the fields
``flows.run_record`` adds), ``took`` (the same as `` (wall)``, for the end of a phrase), ``ran`` (``when, wall``,
or a sentence saying the file does not record them), ``when`` (the day it finished), ``machine``, ``seeds`` and ``per_seed METRIC
REPRESENTATION`` (one value per seed, rounded as the tables round). A figure whose fields its file does not hold
(a file written before they existed) renders empty: ``missing_figures`` names it, and the docs test says so.

``python -m scripts.render_tables`` rewrites every marked table and figure; ``--check`` changes nothing and exits 1 naming
each table that differs from its file (the docs test in ``make test`` does the same).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from contrastive.modalities.base import ResultsTable, format_value, tables_markdown

ROOT = Path(__file__).resolve().parent.parent
FIGURE = re.compile(r"(?P<open><!-- figure: (?P<path>\S+) (?P<view>[^>\n]+?) -->)(?P<body>[^\n]*?)"
                    r"(?P<close><!-- /figure -->)")
MARKED = re.compile(r"(?P<open><!-- table: (?P<path>\S+) (?P<view>\w+) -->\n)(?P<body>.*?)(?P<close><!-- /table -->)",
                    re.S)


def documents(root: Path = ROOT) -> list[Path]:
    """The markdown files whose tables are checked: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render(path: Path, view: str) -> str:
    """The markdown table of ``view`` in the JSON file at ``path`` (or the ``sweep`` view of a sweep's
    ``comparison.csv``), one trailing newline."""
    if view == "sweep":
        return sweep_table(path)
    data = json.loads(path.read_text())
    if view == "mean_std":
        return seeds_table(data)
    if "results" not in data:
        raise ValueError(f"{path}: no 'results' (a summary.json of `mclpipe run`) for the view {view!r}")
    markdown = tables_markdown([ResultsTable(title="", rows=data["results"], metric=view)])
    return markdown.split("\n", 2)[2]  # without the "### title" line and the blank line after it


def seeds_table(data: dict) -> str:
    """``mclpipe reproduce``'s table: mean ± population std per representation and attribute, as it prints it."""
    rows = data["mean_std"]
    attributes = sorted({a for r in rows.values() for a in r})
    lines = ["| representation | " + " | ".join(attributes) + " |", "|---" * (len(attributes) + 1) + "|"]
    for name, stats in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{stats[a][0]:.3f} ± {stats[a][1]:.3f}" for a in attributes)
                     + " |")
    return "\n".join(lines) + "\n"


class MissingField(KeyError):
    """A figure's file does not hold the fields it is rendered from (written before they existed)."""


def _fields(data: dict, *names: str) -> list:
    missing = [name for name in names if data.get(name) is None]
    if missing:
        raise MissingField(", ".join(missing))
    return [data[name] for name in names]


def machine_text(machine: dict) -> str:
    """``2-core AMD EPYC 7B13`` (``, NVIDIA H200`` when a GPU ran it; the load average when it was above 1.5 a
    core at either end: a loaded machine stretches wall times)."""
    text = f"{machine['cores']}-core {machine['cpu']}" + (f", {machine['gpu']}" if machine.get("gpu") else "")
    loads = [x for x in machine.get("load_average") or [] if x is not None]
    if loads and max(loads) > 1.5 * machine["cores"]:
        text += f", load average {max(loads):.0f}"
    return text


def wall_figure(data: dict) -> str:
    """``3.1 min on a 2-core AMD EPYC 7B13`` (``, 9 of 27 steps reused`` when the run found some finished)."""
    seconds, steps, machine = _fields(data, "wall_seconds", "steps", "machine")
    total = steps.get("computed", 0) + steps.get("reused", 0)
    reused = f", {steps['reused']} of {total} steps reused from an earlier run" if steps.get("reused") else ""
    return f"{seconds / 60:.1f} min on a {machine_text(machine)}{reused}"


def when_figure(data: dict) -> str:
    """``2026-11-28 19:40 UTC``: when the command finished."""
    (when,) = _fields(data, "finished_at")
    return when.replace("T", " ").replace("Z", " UTC")


def per_seed_figure(data: dict, metric: str, *representation: str) -> str:
    """``0.555, 0.459 and 0.350``: ``metric`` of ``representation`` for each seed, as the tables round it."""
    (runs,) = _fields(data, "per_seed")
    name = " ".join(representation)
    values = [format_value(run[name][metric], percent=False) for run in runs]
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1]


def seeds_figure(data: dict) -> str:
    """``0, 1 and 2``."""
    (seeds,) = _fields(data, "seeds")
    names = [str(s) for s in seeds]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def ran_figure(data: dict) -> str:
    """``2026-11-28 19:40 UTC, 3.1 min on a 2-core ...``; for a file written before runs recorded these, that."""
    try:
        return f"{when_figure(data)}, {wall_figure(data)}"
    except MissingField:
        return "not recorded in this file (written before runs recorded their time and machine)"


#: inline figure views: name -> function of (the JSON file's data, *the view's arguments)
FIGURES = {"wall": wall_figure, "took": lambda data: f" ({wall_figure(data)})", "ran": ran_figure, "when": when_figure, "machine": lambda data: machine_text(_fields(data, "machine")[0]),
           "per_seed": per_seed_figure, "seeds": seeds_figure}


def render_figure(path: Path, view: str) -> str:
    """The text of the inline figure ``view`` ("name arg ...") of the JSON file at ``path`` ("" when the file does
    not hold its fields)."""
    name, *args = view.split()
    if name not in FIGURES:
        raise ValueError(f"{path}: no figure view {name!r} (one of {', '.join(FIGURES)})")
    try:
        return FIGURES[name](json.loads(path.read_text()), *args)
    except MissingField:
        return ""


def missing_figures(text: str, root: Path = ROOT) -> list[str]:
    """The marked figures of ``text`` that render empty because their file lacks the fields ("path view: fields")."""
    missing = []
    for match in FIGURE.finditer(text):
        name, *args = match["view"].split()
        try:
            data = json.loads((root / match["path"]).read_text())
            if name == "ran":
                _fields(data, "finished_at", "wall_seconds", "steps", "machine")
            FIGURES[name](data, *args)
        except MissingField as exc:
            missing.append(f"{match['path']} {match['view']}: no {exc.args[0]}")
        except (KeyError, OSError, ValueError):
            pass  # rendered() reports it
    return missing


def sweep_table(path: Path) -> str:
    """``mclpipe sweep``'s ``comparison.csv`` as a table: one row per grid point and representation, one column per
    attribute, ``mean ± std`` over the seeds (the CSV's sample std), in the CSV's order."""
    import csv
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    fixed = {"representation", "attribute", "mean", "std", "n", "values"}
    keys = [k for k in rows[0] if k not in fixed] if rows else []
    attributes = list(dict.fromkeys(r["attribute"] for r in rows))
    cells: dict[tuple, dict[str, str]] = {}
    for r in rows:
        cells.setdefault((*(r[k] for k in keys), r["representation"]), {})[r["attribute"]] = \
            f"{float(r['mean']):.3f} ± {float(r['std']):.3f}"
    lines = ["| " + " | ".join([*keys, "representation", *attributes]) + " |",
             "|---" * (len(keys) + 1 + len(attributes)) + "|"]
    lines += ["| " + " | ".join([*point, *(row.get(a, "-") for a in attributes)]) + " |" for point, row in cells.items()]
    return "\n".join(lines) + "\n"


def rendered(text: str, root: Path = ROOT) -> tuple[str, list[str]]:
    """``text`` with every marked table and figure rendered again, and the marks whose text changed ("path view")."""
    stale: list[str] = []

    def replace(match: re.Match, *, render_view) -> str:
        body = render_view(root / match["path"], match["view"])
        if body != match["body"]:
            stale.append(f"{match['path']} {match['view']}")
        return match["open"] + body + match["close"]

    text = MARKED.sub(lambda m: replace(m, render_view=render), text)
    return FIGURE.sub(lambda m: replace(m, render_view=render_figure), text), stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is stale")
    parser.add_argument("files", nargs="*", type=Path, help="markdown files (default: README.md, docs/*.md)")
    args = parser.parse_args(argv)
    failed = False
    for doc in args.files or documents():
        new, stale = rendered(doc.read_text())
        for mark in stale:
            print(f"{doc}: {mark} differs from its file"
                  + ("; run `python -m scripts.render_tables`" if args.check else ": rendered again"))
        if stale and not args.check:
            doc.write_text(new)
        failed |= bool(stale) and args.check
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
