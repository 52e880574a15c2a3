"""Render the results tables marked in README.md and docs/*.md from the JSON files the commands wrote.

A rendered table sits between two markers naming its file and what of it to show::

    <!-- table: docs/data/trifeature_quick-seed0.summary.json probe -->
    | representation | color | shape | texture |
    ...
    <!-- /table -->

Views: ``probe``, ``knn`` (or any metric prefix) of a pipeline's ``summary.json`` (``mclpipe run`` writes it to
``runs/pipelines/<pipeline id>/``; rendered as the pipeline's own results.md renders it), and ``mean_std`` of the
JSON ``mclpipe reproduce`` writes (``runs/reproduce/<name>.json``). Paths are relative to the repository root.

``python -m scripts.render_tables`` rewrites every marked table; ``--check`` changes nothing and exits 1 naming
each table that differs from its file (the docs test in ``make test`` does the same).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from contrastive.modalities.base import ResultsTable, tables_markdown

ROOT = Path(__file__).resolve().parent.parent
MARKED = re.compile(r"(?P<open><!-- table: (?P<path>\S+) (?P<view>\w+) -->\n)(?P<body>.*?)(?P<close><!-- /table -->)",
                    re.S)


def documents(root: Path = ROOT) -> list[Path]:
    """The markdown files whose tables are checked: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render(path: Path, view: str) -> str:
    """The markdown table of ``view`` in the JSON file at ``path`` (one trailing newline)."""
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


def rendered(text: str, root: Path = ROOT) -> tuple[str, list[str]]:
    """``text`` with every marked table rendered again, and the marks whose table changed ("path view")."""
    stale: list[str] = []

    def replace(match: re.Match) -> str:
        body = render(root / match["path"], match["view"])
        if body != match["body"]:
            stale.append(f"{match['path']} {match['view']}")
        return match["open"] + body + match["close"]

    return MARKED.sub(replace, text), stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is stale")
    parser.add_argument("files", nargs="*", type=Path, help="markdown files (default: README.md, docs/*.md)")
    args = parser.parse_args(argv)
    failed = False
    for doc in args.files or documents():
        new, stale = rendered(doc.read_text())
        for mark in stale:
            print(f"{doc}: the table of {mark} differs from its file"
                  + ("; run `python -m scripts.render_tables`" if args.check else ": rendered again"))
        if stale and not args.check:
            doc.write_text(new)
        failed |= bool(stale) and args.check
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
