"""The house as an import graph: every layer rule of docs/architecture.md ("The layers"), no circle between files,
rooms or packages, no upward import, and a library core that names no modality.

The graph is read with ``ast`` from every ``.py`` file of contrastive/, pipeline_config/, launchers/, planning/,
tasks/ and flows/, function-level imports included. ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else
to ``a.b``. The registry's ``import_module`` of a modality by its ``pipeline:`` key is a lookup by name, not an
import statement, and is not an edge (the plug-in point: nothing names a modality to reach it).
"""
import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("contrastive", "pipeline_config", "launchers", "planning", "tasks", "flows")
ORCHESTRATION = ("prefect", "mlflow")

#: The library's subpackages, each a room; a modality's package (subpackages included) is one room, and so is
#: each module at the library's top (errors, evaluate, embeddings, settings, ...).
LIBRARY_ROOMS = ("contrastive.engine", "contrastive.data", "contrastive.mcl", "contrastive.methods",
                 "contrastive.models")
MODALITY = re.compile(r"^contrastive\.modalities\.(?!base$|registry$)([a-z_0-9]+)")

#: Layers, lowest first. An import from a lower layer to a higher one is upward.
RANKS = {"engine": 0, "library": 1, "modalities": 2, "launchers": 2, "pipeline_config": 3, "planning": 4, "tasks": 5,
         "flows": 6}

#: Imports between two modalities: image-text builds on the image modality (its synthetic pairs are Trifeature
#: scenes; its registered model takes images the way the image model does). Nothing else crosses modalities.
BETWEEN_MODALITIES = {("image_text", "image")}

#: Imports from a lower layer to a higher one that docs/architecture.md explains: none.
DOCUMENTED_UPWARD: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def house() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}


def imported_names(path: Path, module: str) -> list[str]:
    """Every name ``path`` imports, anywhere in the file (function bodies included), relative imports resolved."""
    names = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            names += [f"{base}.{alias.name}" for alias in node.names] + [base]
    return names


@cache
def resolve(name: str) -> str | None:
    """The house module ``name`` is or lies in (``a.b.c`` -> ``a.b`` when ``c`` is no module), else None."""
    modules = house()
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@cache
def imports() -> dict[str, tuple[str, ...]]:
    """module -> every name it imports (read once)."""
    return {module: tuple(imported_names(path, module)) for module, path in house().items()}


def graph(extra: dict[str, list[str]] | None = None) -> dict[str, set[str]]:
    """module -> the house modules it imports; ``extra`` adds imports to a module (for the mutation tests)."""
    edges = {}
    for module, names in imports().items():
        names = [*names, *(extra or {}).get(module, [])]
        edges[module] = {target for target in map(resolve, names) if target and target != module}
    return edges


def third_party(extra: dict[str, list[str]] | None = None) -> dict[str, set[str]]:
    """module -> the top-level names of what it imports from outside the house."""
    return {module: {n.split(".")[0] for n in [*names, *(extra or {}).get(module, [])] if n and resolve(n) is None}
            for module, names in imports().items()}


def layer(module: str) -> str:
    top = module.split(".")[0]
    if top != "contrastive":
        return top
    if module.startswith("contrastive.engine") or module == "contrastive.errors":
        return "engine"
    if module.startswith("contrastive.modalities"):
        return "modalities"
    return "library"


def room(module: str) -> str:
    """Where a module lives: a top-level package, a library subpackage or top-level module, the modality
    framework (``contrastive.modalities``: base, registry) or one modality's package."""
    if match := MODALITY.match(module):
        return f"contrastive.modalities.{match.group(1)}"
    if module.startswith("contrastive.modalities"):
        return "contrastive.modalities"
    for name in LIBRARY_ROOMS:
        if module == name or module.startswith(name + "."):
            return name
    if module.startswith("contrastive.") and module.count(".") == 1:
        return module  # a module of the library's top (evaluate, embeddings, settings, ...) is a room of its own
    return module.split(".")[0]


def modality_of(module: str) -> str | None:
    match = MODALITY.match(module)
    return match.group(1) if match else None


# ---------------------------------------------------------------------------------------------------- the rules
def rule_breaks(edges: dict[str, set[str]], outside: dict[str, set[str]]) -> list[str]:
    """Every import that breaks a row of docs/architecture.md's layer table, as "importer -> imported (rule)"."""
    broken = []
    for module, targets in edges.items():
        kind = layer(module)
        for target in sorted(targets):
            where = layer(target)
            if kind == "engine" and where != "engine":
                broken.append(f"{module} -> {target} (the engine imports only itself and contrastive.errors)")
            elif kind in ("library", "modalities") and where not in ("engine", "library", "modalities"):
                broken.append(f"{module} -> {target} (the library imports no pipeline_config, launchers, tasks, "
                              "flows)")
            elif kind == "library" and where == "modalities":
                broken.append(f"{module} -> {target} (the library core imports no modality)")
            elif kind == "modalities" and modality_of(module) is None and modality_of(target) is not None:
                broken.append(f"{module} -> {target} (base and registry import no modality)")
            elif (modality_of(module) and modality_of(target) and modality_of(module) != modality_of(target)
                  and (modality_of(module), modality_of(target)) not in BETWEEN_MODALITIES):
                broken.append(f"{module} -> {target} (a modality imports no other modality)")
            elif kind == "launchers" and where not in ("launchers",) and target not in (
                    "contrastive", "contrastive.errors", "contrastive.engine.launch"):
                broken.append(f"{module} -> {target} (launchers import only contrastive.engine.launch and "
                              "contrastive.errors)")
            elif kind == "pipeline_config" and where in ("planning", "tasks", "flows"):
                broken.append(f"{module} -> {target} (pipeline_config imports no planning, tasks, flows)")
            elif kind == "planning" and where in ("launchers", "tasks", "flows"):
                broken.append(f"{module} -> {target} (planning imports no launchers, tasks, flows)")
            elif kind == "tasks" and where == "flows":
                broken.append(f"{module} -> {target} (tasks import no flows)")
    for module, names in outside.items():
        kind = layer(module)
        for name in sorted(set(names) & set(ORCHESTRATION)):
            if kind in ("engine", "library", "modalities", "launchers", "pipeline_config", "planning"):
                broken.append(f"{module} -> {name} (no prefect, no mlflow below tasks)")
            elif name == "mlflow" and kind == "tasks" and not module.startswith("tasks.tracking"):
                broken.append(f"{module} -> mlflow (tasks import mlflow only in tasks/tracking)")
    return broken


def cycles(edges: dict[str, set[str]], node_of) -> list[list[str]]:
    """The circles of the graph with its modules merged by ``node_of`` (strongly connected components of more than
    one node, by Tarjan's algorithm)."""
    merged: dict[str, set[str]] = {}
    for module, targets in edges.items():
        merged.setdefault(node_of(module), set()).update(node_of(t) for t in targets if node_of(t) != node_of(module))
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(merged.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(merged):
        if node not in index:
            visit(node)
    return found


def upward(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(m, t) for m, targets in edges.items() for t in targets if RANKS[layer(m)] < RANKS[layer(t)]}


def check_house(extra: dict[str, list[str]] | None = None) -> list[str]:
    """Every problem of the house's imports (empty: the layers hold)."""
    edges = graph(extra)
    problems = rule_breaks(edges, third_party(extra))
    for name, node_of in (("file", lambda m: m), ("room", room), ("package", lambda m: m.split(".")[0])):
        problems += [f"a circle between {name}s: {' <-> '.join(c)}" for c in cycles(edges, node_of)]
    found = upward(edges)
    problems += [f"upward import {m} -> {t}: docs/architecture.md does not explain it"
                 for m, t in sorted(found - DOCUMENTED_UPWARD)]
    if len(found) > 1:
        problems.append(f"{len(found)} upward imports: at most one")
    return problems


# ---------------------------------------------------------------------------------------------------- the tests
def test_the_house_keeps_its_layers():
    assert len(house()) > 100 and sum(map(len, graph().values())) > 300  # the graph was read, not an empty tree
    assert check_house() == []


def test_the_library_core_names_no_modality():
    core = {m: t for m, t in graph().items() if layer(m) in ("engine", "library")}
    assert core and not {(m, t) for m, targets in core.items() for t in targets if layer(t) == "modalities"}


@pytest.mark.parametrize("importer, imported, says", [
    ("contrastive.engine.loop", "contrastive.data.loading", "the engine imports only itself"),
    ("contrastive.data.shards", "contrastive.modalities.image_text.data", "the library core imports no modality"),
    ("contrastive.evaluate", "contrastive.modalities.registry", "the library core imports no modality"),
    ("contrastive.modalities.text.steps", "contrastive.modalities.image.steps", "imports no other modality"),
    ("contrastive.modalities.registry", "contrastive.modalities.image.modality", "base and registry import no"),
    ("contrastive.modalities.image.config", "pipeline_config.schema", "the library imports no pipeline_config"),
    ("launchers.slurm", "contrastive.data.dataset", "launchers import only"),
    ("pipeline_config.loader", "tasks.records", "pipeline_config imports no planning, tasks"),
    ("pipeline_config.schema", "planning.model", "pipeline_config imports no planning"),
    ("planning.calibrate", "flows.run_costs", "planning imports no launchers, tasks, flows"),
    ("planning.model", "tasks.steps", "planning imports no launchers, tasks, flows"),
    ("planning.probes", "mlflow", "no prefect, no mlflow below tasks"),
    ("tasks.records", "flows.runner", "tasks import no flows"),
    ("contrastive.sweep", "mlflow", "no prefect, no mlflow below tasks"),
    ("pipeline_config.schema", "prefect", "no prefect, no mlflow below tasks"),
    ("tasks.steps", "mlflow", "mlflow only in tasks/tracking"),
    ("flows.shutdown", "flows.faults", "a circle between files: flows.faults <-> flows.shutdown"),
    ("contrastive.mcl.sampler", "contrastive.mcl.steps", "a circle between files"),
    ("contrastive.engine.task", "contrastive.errors", None),  # allowed: the check is not blind
])
def test_a_forbidden_import_is_caught(importer, imported, says):
    """Each rule fails on one import added to the real graph (the mutation that shows it can fail)."""
    problems = check_house({importer: [imported]})
    if says is None:
        assert problems == []
    else:
        assert any(says in p and importer in p for p in problems), problems


def test_an_upward_import_is_caught_and_at_most_one_is_allowed():
    one = check_house({"contrastive.mcl.steps": ["tasks.records"]})
    assert any("upward import contrastive.mcl.steps -> tasks.records" in p for p in one)
    two = check_house({"contrastive.mcl.steps": ["tasks.records"], "launchers.base": ["pipeline_config.loader"]})
    assert any("2 upward imports: at most one" in p for p in two)


def test_the_rules_match_the_documented_layer_table():
    """docs/architecture.md's table names exactly the layers these rules check (a new row needs a rule here)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("| layer | may import | never imports |"):].split("\n\n")[0]
    rows = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert rows == ["`contrastive/engine/`", "`contrastive/` (the core: data, mcl, methods, models, evaluate, ...)",
                    "`contrastive/modalities/`", "`launchers/`", "`pipeline_config/`", "`planning/`", "`tasks/`",
                    "`flows/`"]
    assert "upward" in text and "no upward import" in text
