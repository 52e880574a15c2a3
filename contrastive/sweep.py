"""Ablation sweeps as data: a grid of ``--set`` values, its points, and the one comparison of their results
(mean +- std over seeds per grid point, representation and attribute of the modality's sweep metric; a markdown
table, a CSV and a plot of the scores against each swept key). The Prefect flow that runs the points is ``flows.sweep_flow``; nothing here runs anything.
"""
from __future__ import annotations

import csv
import itertools
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contrastive.errors import ConfigError


def split_values(text: str) -> list[str]:
    """Split ``V1,V2,...`` on the commas outside brackets, so list values survive: ``[4,2],[8,2]`` -> 2 values."""
    values, depth, current = [], 0, []
    for char in text:
        if char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        if char == "," and depth == 0:
            values.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    values.append("".join(current).strip())
    return values


def parse_grid(specs: Sequence[str]) -> dict[str, list[str]]:
    """``["mcl.clusters=2,5,10", "method.temperature=0.1,0.5"]`` -> {key: [values as --set text]}, in order.

    Raises:
        ConfigError: a spec without ``=``, an empty value, or a key given twice (the message names the fix).
    """
    grid: dict[str, list[str]] = {}
    for spec in specs:
        key, sep, raw = spec.partition("=")
        key = key.strip()
        values = split_values(raw) if sep else []
        if not key or not values or any(not v for v in values):
            raise ConfigError(f"--grid {spec!r} is not KEY=V1,V2,...: write e.g. --grid mcl.clusters=2,5,10")
        if key == "seed":
            raise ConfigError("--grid seed=... is what --seeds is for: use --seeds 0,1,2")
        if key in grid:
            raise ConfigError(f"--grid names {key} twice: give all its values in one --grid {key}=V1,V2")
        grid[key] = values
    if not grid:
        raise ConfigError("a sweep needs at least one --grid KEY=V1,V2,...")
    return grid


def sweep_section(section: object, *, where: str) -> tuple[dict[str, list[str]], list[int] | None]:
    """A config file's ``sweep:`` section -> (grid as --set text, seeds or None)::

        sweep:
          grid: {mcl.clusters: [2, 5, 10], method.temperature: [0.1, 0.5]}
          seeds: [0, 1, 2]

    Values are written back as YAML flow text (``[4, 2]`` stays a list), the form ``--set`` parses.
    """
    if not isinstance(section, dict) or not isinstance(section.get("grid"), dict) or \
            set(section) - {"grid", "seeds"}:
        raise ConfigError(f"{where}: the sweep section must be {{grid: {{key: [values]}}, seeds: [ints]}} "
                          "(e.g. grid: {mcl.clusters: [2, 5]})")
    specs = []
    for key, values in section["grid"].items():
        values = values if isinstance(values, list) else [values]
        specs.append(f"{key}=" + ",".join(json.dumps(v) if isinstance(v, (list, dict)) else str(v) for v in values))
    seeds = section.get("seeds")
    if seeds is not None and (not isinstance(seeds, list) or not all(isinstance(s, int) for s in seeds)):
        raise ConfigError(f"{where}: sweep.seeds must be a list of integers, got {seeds!r}")
    return parse_grid(specs), seeds


def merge_grids(base: dict[str, list[str]], given: dict[str, list[str]]) -> dict[str, list[str]]:
    """The file's grid with the command line's keys replacing or adding to it."""
    return {**base, **given}


def expand_grid(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """Every combination of the grid's values (the first key varies slowest), as {key: value}."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def point_label(point: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())


def point_overrides(point: dict[str, str], *, seed: int) -> list[str]:
    """The ``--set`` overrides of one run of the sweep."""
    return [f"{k}={v}" for k, v in point.items()] + [f"seed={seed}"]


@dataclass
class SweepRun:
    """One finished pipeline of the sweep: its grid point, seed, results ({representation: {metric: value}}) and
    pipeline id."""
    point: dict[str, str]
    seed: int
    results: dict[str, dict[str, float]]
    pipeline_id: str = ""
    extra: dict = field(default_factory=dict)


def aggregate(runs: Sequence[SweepRun], *, metric: str = "probe") -> list[dict]:
    """One row per (grid point, representation, attribute): mean and population std of ``metric`` over the seeds.

    Rows keep the grid's point order, then the representations in the order the first run reported them, then the
    attributes sorted. Each row: the point's keys, ``representation``, ``attribute``, ``mean``, ``std``, ``n``
    (seeds), ``values`` (per seed, in seed order).
    """
    groups: dict[tuple, list[SweepRun]] = {}
    for run in runs:
        groups.setdefault(tuple(run.point.items()), []).append(run)
    rows = []
    for point_items, members in groups.items():
        members = sorted(members, key=lambda r: r.seed)
        representations = list(dict.fromkeys(name for r in members for name in r.results))
        for name in representations:
            attributes = sorted({k.split("/", 1)[1] for r in members for k in r.results.get(name, {})
                                 if k.startswith(metric + "/")})
            for attribute in attributes:
                values = [r.results[name][f"{metric}/{attribute}"] for r in members
                          if f"{metric}/{attribute}" in r.results.get(name, {})]
                rows.append({**dict(point_items), "representation": name, "attribute": attribute,
                             "mean": statistics.fmean(values), "std": statistics.pstdev(values), "n": len(values),
                             "values": values})
    return rows


def comparison_markdown(rows: Sequence[dict], *, keys: Sequence[str]) -> str:
    """A markdown table: one line per (grid point, representation), one column per attribute, "mean ± std"."""
    attributes = sorted({r["attribute"] for r in rows})
    lines = ["| " + " | ".join([*keys, "representation", *attributes]) + " |",
             "|" + "---|" * (len(keys) + 1 + len(attributes))]
    table: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        table.setdefault(tuple(row[k] for k in keys) + (row["representation"],), {})[row["attribute"]] = row
    for line_key, cells in table.items():
        shown = [f"{cells[a]['mean']:.3f} ± {cells[a]['std']:.3f}" if a in cells else "" for a in attributes]
        lines.append("| " + " | ".join([*line_key, *shown]) + " |")
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[dict], path: Path, *, keys: Sequence[str]) -> Path:
    """The rows as CSV (per-seed values joined by ';')."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = [*keys, "representation", "attribute", "mean", "std", "n", "values"]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({**{c: row[c] for c in columns if c != "values"},
                             "values": ";".join(f"{v:.6f}" for v in row["values"])})
    return path


def headline_representation(rows: Sequence[dict]) -> str:
    """The representation a plot shows: the MCL concatenation when the sweep has one, else the last stage."""
    names = list(dict.fromkeys(r["representation"] for r in rows))
    if "MCL concat" in names:
        return "MCL concat"
    stages = [n for n in names if n.startswith("stage ")]
    return stages[-1] if stages else names[0]


def plot_against(rows: Sequence[dict], *, key: str, path: Path, representation: str | None = None,
                 ylabel: str = "linear-probe accuracy", percent: bool = False) -> Path:
    """The scores of ``representation`` (``ylabel``: fractions, or ``percent``) against the values of ``key``
    (averaged over the other swept keys), one line per attribute, error bars = the mean of the per-point stds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    representation = representation or headline_representation(rows)
    chosen = [r for r in rows if r["representation"] == representation]
    values = list(dict.fromkeys(r[key] for r in chosen))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for attribute in sorted({r["attribute"] for r in chosen}):
        means = [statistics.fmean(r["mean"] for r in chosen if r[key] == v and r["attribute"] == attribute)
                 for v in values]
        stds = [statistics.fmean(r["std"] for r in chosen if r[key] == v and r["attribute"] == attribute)
                for v in values]
        ax.errorbar(range(len(values)), means, yerr=stds, marker="o", capsize=3, label=attribute)
    ax.set_xticks(range(len(values)), values)
    ax.set_xlabel(key)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 102 if percent else 1.02)
    ax.set_title(representation)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
