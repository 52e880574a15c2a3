"""`make mutation`: mutation testing (mutmut 3) of the library's core, each module group against its own fast unit
tests, and the per-module table (killed / survived / timed out / no tests) docs/testing.md reads.

Each group runs in a scratch copy of its own, ``mutants/<group>/`` (gitignored): the package, tests/ and a
pyproject.toml whose ``[tool.mutmut]`` names the group's files (``only_mutate``) and its tests
(``pytest_add_cli_args_test_selection``), so a mutant is judged by the tests that claim to guard it, not by the
end-to-end flows that happen to reach it. mutmut itself copies that scratch tree again into its ``mutants/``
folder and swaps one mutant in at a time through its trampolines.

    python scripts/mutation.py                     # every group, one after the other
    python scripts/mutation.py mcl losses          # some groups
    python scripts/mutation.py --report            # the table of the groups already run, without running any
    MUTATION_WORKERS=2 nice -n 15 python scripts/mutation.py   # how it is run on the shared 2-core machine

The survivors of a group: ``cd mutants/<group> && ../../.venv/bin/mutmut results`` and ``mutmut show <name>``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / "mutants"

#: group -> (the files mutated, the fast unit tests that guard them)
GROUPS: dict[str, tuple[list[str], list[str]]] = {
    "mcl": ([f"contrastive/mcl/{name}.py" for name in ("pseudo_labels", "batch_plan", "sampler", "small_groups",
                                                       "codes")],
            ["tests/unit/mcl"]),
    "clustering": ([f"contrastive/mcl/{name}.py" for name in ("clustering", "ids", "lloyd_torch")],
                   ["tests/unit/mcl"]),
    "losses": (["contrastive/methods/losses.py", "contrastive/methods/dimension_losses.py"],
               ["tests/unit/methods/test_losses.py", "tests/unit/methods/test_losses_precision.py",
                "tests/unit/methods/test_vicreg_barlow.py", "tests/unit/methods/test_hex.py",
                "tests/unit/methods/test_hex_authors.py"]),
    "hex": (["contrastive/methods/hex.py", "contrastive/methods/dimension_hex.py"],
            ["tests/unit/methods/test_hex.py", "tests/unit/methods/test_hex_authors.py",
             "tests/unit/methods/test_vicreg_barlow.py"]),
    "embeddings": (["contrastive/embeddings.py"], ["tests/unit/test_embeddings.py"]),
    "checkpoint": (["contrastive/engine/checkpoint.py", "contrastive/engine/safe_load.py"],
                   ["tests/unit/engine/test_checkpoint.py", "tests/unit/test_safe_loading.py"]),
}

STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 36: "timeout",
          24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout", -11: "segfault", -9: "segfault"}


def others() -> list[str]:
    """The project's other top-level packages (not mutated; copied beside it for the tests' imports)."""
    return sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name not in ("contrastive", "tests"))


def mutmut_table(group: str) -> str:
    """The [tool.mutmut] table of one group."""
    mutated, tests = GROUPS[group]
    tests = [t for t in tests if (ROOT / t).exists()]
    quoted = lambda items: "[" + ", ".join(json.dumps(i) for i in items) + "]"  # noqa: E731
    return ("[tool.mutmut]\n"
            'source_paths = ["contrastive"]\n'
            f"only_mutate = {quoted(mutated)}\n"
            f"pytest_add_cli_args_test_selection = {quoted(tests)}\n"
            f"also_copy = {quoted(others())}\n"
            'pytest_add_cli_args = ["-p", "no:randomly", "-p", "no:cacheprovider", "-m", "not slow", "-q"]\n'
            "timeout_multiplier = 5.0\n"
            "timeout_constant = 10.0\n"
            "use_git_change_detection = false\n")


def undecorated(source: str) -> str:
    """``@d def f(...)`` at module level as ``def f(...)`` followed by ``f = d(f)``: the same function, but one mutmut
    mutates (it leaves decorated functions alone: ``@fp32_logits`` would hide every loss from it)."""
    import ast
    lines = source.splitlines(keepends=True)
    functions = [node for node in ast.parse(source).body
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.decorator_list]
    for node in sorted(functions, key=lambda n: n.lineno, reverse=True):
        applied = node.name
        for decorator in reversed(node.decorator_list):
            applied = f"{ast.get_source_segment(source, decorator)}({applied})"
        first = min(d.lineno for d in node.decorator_list) - 1
        def_line = node.lineno - 1
        lines[node.end_lineno:node.end_lineno] = [f"{node.name} = {applied}\n"]
        del lines[first:def_line]
    return "".join(lines)


def prepare(group: str) -> Path:
    """A fresh scratch copy for ``group``: the package, tests/ and a pyproject.toml naming the group."""
    work = SCRATCH / group
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "contrastive", work / "contrastive", ignore=ignore)
    shutil.copytree(ROOT / "tests", work / "tests", ignore=ignore)
    for package in others():  # what the tests import besides the library (bench's toy tasks, pipeline_config)
        shutil.copytree(ROOT / package, work / package, ignore=ignore)
    for path in GROUPS[group][0]:
        (work / path).write_text(undecorated((work / path).read_text()))
    project = (ROOT / "pyproject.toml").read_text()
    head, _, rest = project.partition("[tool.mutmut]")
    if rest:  # a [tool.mutmut] table of the repository's own is replaced by the group's
        rest = rest[rest.find("\n[") + 1:] if "\n[" in rest else ""
    (work / "pyproject.toml").write_text(head + rest + "\n" + mutmut_table(group))
    return work


def run(group: str, *, workers: int) -> float:
    work = prepare(group)
    # one torch thread a mutant: the workers run side by side, and a fork of a process with OpenMP threads hangs
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "CI": "", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    started = time.monotonic()
    subprocess.run([str(Path(sys.executable).with_name("mutmut")), "run", "--max-children", str(workers)], cwd=work,
                   env=env, check=False)
    return time.monotonic() - started


def counts(group: str) -> dict[str, Counter]:
    """Per mutated file: how many mutants ended how (from mutmut's .meta files)."""
    found: dict[str, Counter] = {}
    for path in GROUPS[group][0]:
        meta = SCRATCH / group / "mutants" / (path + ".meta")
        if not meta.exists():
            continue
        codes = json.loads(meta.read_text()).get("exit_code_by_key", {})
        found[path] = Counter(STATUS.get(code, "not checked" if code is None else "suspicious")
                              for code in codes.values())
    return found


def survivors(group: str) -> list[str]:
    found = []
    for path in GROUPS[group][0]:
        meta = SCRATCH / group / "mutants" / (path + ".meta")
        if meta.exists():
            found += sorted(k for k, code in json.loads(meta.read_text()).get("exit_code_by_key", {}).items()
                            if code == 0)
    return found


def table(groups: list[str]) -> str:
    lines = ["| module | mutants | killed | survived | timed out | no tests | killed % |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for group in groups:
        for path, c in counts(group).items():
            total = sum(c.values())
            judged = c["killed"] + c["timeout"] + c["survived"]
            score = f"{100 * (c['killed'] + c['timeout']) / judged:.0f} %" if judged else "-"
            lines.append(f"| {path} | {total} | {c['killed']} | {c['survived']} | {c['timeout']} | {c['no tests']} "
                         f"| {score} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("groups", nargs="*", default=[], help=f"groups to run (default: all): {', '.join(GROUPS)}")
    parser.add_argument("--report", action="store_true", help="print the table of groups already run; run none")
    parser.add_argument("--survivors", action="store_true", help="also list each group's surviving mutants")
    args = parser.parse_args(argv)
    groups = args.groups or list(GROUPS)
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}: choose from {', '.join(GROUPS)}")
    workers = int(os.environ.get("MUTATION_WORKERS", "2"))
    for group in ([] if args.report else groups):
        seconds = run(group, workers=workers)
        print(f"mutation: {group} took {seconds / 60:.1f} min", flush=True)
    print(table(groups))
    if args.survivors:
        for group in groups:
            print(f"\n{group} survivors:", *survivors(group), sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
