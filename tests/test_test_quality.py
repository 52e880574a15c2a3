"""The test-quality habit of docs/architecture.md ("What a test here must show"), checked on every test file by
reading its syntax tree (no test is imported or run; about a second):

- ``monkeypatch.setattr(..., raising=False)`` (or ``delattr``) on a name of mclpipe's own modules: a renamed
  constant or function then silently patches nothing, and the test checks something else than it says. Pass
  ``raising=False`` only for names of other libraries that may be absent (a faiss build without GPU functions).
- ``pytest.importorskip`` in tests/e2e: an end-to-end test needs components CI installs, and a skip there is a
  check that silently never ran; use ``tests.components.require_modules`` (skips on a developer's machine, fails
  under ``CI=true``).
- a test function that asserts nothing: no ``assert``, no ``pytest.raises`` / ``warns`` / ``fail``, and no call of
  a helper that asserts (a name starting with ``assert`` or ``check_``, such as ``numpy.testing.assert_allclose``
  or a helper of tests/, or one of :data:`ASSERTING_HELPERS`). It passes whatever the code does unless it
  raises.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
OWN_PACKAGES = ("contrastive", "tasks", "flows", "pipeline_config", "bench")

#: Helpers of tests/ that assert although their names do not say so (each checked below to hold an assert).
ASSERTING_HELPERS: frozenset[str] = frozenset()


def linted_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p.name.startswith("test_") or p.name == "conftest.py")


def where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(TESTS.parent)}:{node.lineno}"


def is_own(module: str) -> bool:
    return module.partition(".")[0] in OWN_PACKAGES


# ---------------------------------------------------------------------------------------------------- raising=False
def imported_names(tree: ast.Module) -> dict[str, str]:
    """Every name a file binds by an import, anywhere in it (function-level imports included): name -> the dotted
    path it stands for (``from contrastive.x import y as z``: z -> contrastive.x.y)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    names[alias.name.partition(".")[0]] = alias.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def source_of(module: str) -> Path | None:
    """The file of one of mclpipe's modules, found without importing it (the lint stays a syntax read)."""
    base = TESTS.parent / module.replace(".", "/")
    return next((path for path in (base.with_suffix(".py"), base / "__init__.py") if path.is_file()), None)


def names_of_other_libraries(module: Path) -> set[str]:
    """The names a module binds by importing them from outside mclpipe (``import os``, ``from x import y``)."""
    found = set()
    for name, origin in imported_names(ast.parse(module.read_text(), filename=str(module))).items():
        if not is_own(origin):
            found.add(name)
    return found


def patches_own_name(call: ast.Call, imports: dict[str, str]) -> bool:
    """Whether ``monkeypatch.setattr/delattr(target, ...)``'s target is mclpipe's own: a dotted string of its
    modules, or a name of its modules (``grouped``, ``grouped.LABEL_CHUNK``), not another library reached through
    one (``loading.os``: the os module that ``contrastive.data.loading`` imports)."""
    target = call.args[0] if call.args else None
    if isinstance(target, ast.Constant) and isinstance(target.value, str):
        return is_own(target.value)
    parts = dotted(target) if target is not None else None
    if not parts or parts[0] not in imports or not is_own(imports[parts[0]]):
        return False
    module, attributes = imports[parts[0]], parts[1:]
    while attributes and source_of(f"{module}.{attributes[0]}") is not None:  # a submodule of ours
        module, attributes = f"{module}.{attributes[0]}", attributes[1:]
    source = source_of(module)
    return not (attributes and source is not None and attributes[0] in names_of_other_libraries(source))


def raising_false_on_own_names(path: Path, tree: ast.Module) -> list[str]:
    imports = imported_names(tree)
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("setattr", "delattr")
                and any(k.arg == "raising" and isinstance(k.value, ast.Constant) and k.value.value is False
                        for k in node.keywords)
                and patches_own_name(node, imports)):
            found.append(where(path, node))
    return found


# ---------------------------------------------------------------------------------------------------- importorskip
def importorskips(path: Path, tree: ast.Module) -> list[str]:
    return [where(path, node) for node in ast.walk(tree) if isinstance(node, ast.Call)
            and ((isinstance(node.func, ast.Attribute) and node.func.attr == "importorskip")
                 or (isinstance(node.func, ast.Name) and node.func.id == "importorskip"))]


# ---------------------------------------------------------------------------------------------------- asserts
PYTEST_CHECKS = {"raises", "warns", "fail", "deprecated_call"}


def called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def checks_something(function: ast.AST) -> bool:
    for node in ast.walk(function):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call):
            name = called_name(node)
            if name.startswith(("assert", "check_")) or name in ASSERTING_HELPERS:
                return True
            if (name in PYTEST_CHECKS and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "pytest"):
                return True
    return False


def collected_tests(tree: ast.Module):
    """Module-level ``test_*`` functions and those of ``Test*`` classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            yield node
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            yield from (n for n in node.body
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test"))


def unchecked_tests(path: Path, tree: ast.Module) -> list[str]:
    if not path.name.startswith("test_"):
        return []
    return [f"{where(path, f)} {f.name}" for f in collected_tests(tree) if not checks_something(f)]


# ---------------------------------------------------------------------------------------------------- the checks
@pytest.fixture(scope="module")
def parsed() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), filename=str(path)) for path in linted_files()}


def test_no_monkeypatch_with_raising_false_on_mclpipe_s_own_names(parsed):
    found = [hit for path, tree in parsed.items() for hit in raising_false_on_own_names(path, tree)]
    assert found == [], ("monkeypatch.setattr(..., raising=False) on mclpipe's own name: a rename would silently "
                         f"patch nothing; drop raising=False: {found}")


def test_no_importorskip_in_the_end_to_end_tests(parsed):
    found = [hit for path, tree in parsed.items() if "e2e" in path.relative_to(TESTS).parts
             for hit in importorskips(path, tree)]
    assert found == [], ("pytest.importorskip in tests/e2e skips silently under CI; use "
                         f"tests.components.require_modules: {found}")


def test_every_test_asserts_something(parsed):
    found = [hit for path, tree in parsed.items() for hit in unchecked_tests(path, tree)]
    assert found == [], ("a test without an assert, pytest.raises or an asserting helper (assert_*/check_*) passes "
                         f"whatever the code does: {found}")


def test_the_asserting_helpers_assert(parsed):
    """Each name of ASSERTING_HELPERS is a function of tests/ that holds an assert itself."""
    defined = {node.name: node for tree in parsed.values() for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef)}
    for name in ASSERTING_HELPERS:
        assert name in defined and any(isinstance(n, ast.Assert) for n in ast.walk(defined[name])), name


# ---------------------------------------------------------------------------------------------------- the lint's own
LINTED = '''
import pytest
from contrastive.data import loading
from contrastive.modalities.image_text import grouped
import faiss


def test_patches(monkeypatch):
    monkeypatch.setattr(grouped, "LABEL_CHUNK", 64, raising=False)
    monkeypatch.setattr("contrastive.modalities.image_text.grouped.WRITE_CHUNK", 1, raising=False)
    monkeypatch.setattr(grouped, "WRITE_CHUNK", 1)
    monkeypatch.setattr(loading.os, "sched_getaffinity", len, raising=False)
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0, raising=False)
    assert True


def test_nothing():
    grouped.LABEL_CHUNK


def test_raises():
    with pytest.raises(ValueError):
        int("x")


def test_helper():
    check_slots(3)


class TestGroup:
    def test_method(self):
        np.testing.assert_array_equal(1, 1)

    def test_empty_method(self):
        pass


@pytest.fixture
def browser():
    return pytest.importorskip("playwright")
'''


def test_the_lint_finds_what_it_names(tmp_path):
    """The checks on a file written to break each rule once, beside uses they allow."""
    path = TESTS / "e2e" / "test_linted.py"  # named as if in tests/e2e; never written
    tree = ast.parse(LINTED)
    lines = {name: n for n, line in enumerate(LINTED.splitlines(), 1) for name in [line.strip()]}
    assert raising_false_on_own_names(path, tree) == [
        f"tests/e2e/test_linted.py:{lines[s]}" for s in (
            'monkeypatch.setattr(grouped, "LABEL_CHUNK", 64, raising=False)',
            'monkeypatch.setattr("contrastive.modalities.image_text.grouped.WRITE_CHUNK", 1, raising=False)')]
    assert unchecked_tests(path, tree) == [
        f"tests/e2e/test_linted.py:{lines['def test_nothing():']} test_nothing",
        f"tests/e2e/test_linted.py:{lines['def test_empty_method(self):']} test_empty_method"]
    assert importorskips(path, tree) == [
        f"tests/e2e/test_linted.py:{lines['return pytest.importorskip(' + chr(34) + 'playwright' + chr(34) + ')']}"]
