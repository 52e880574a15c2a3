"""The test-quality habit of docs/testing.md (and docs/architecture.md, "What a test here must show"), checked on
every Python file under tests/ (test files, conftest.py and helper modules such as tests/e2e/load.py) by reading
its syntax tree (no test is imported or run; about a second):

- ``monkeypatch.setattr(..., raising=False)`` (or ``delattr``; ``raising`` by keyword or by position) on a name of
  mclpipe's own packages (every top-level package of the repository: launchers and planning included): a renamed
  constant or function then silently patches nothing, and the test checks something else than it says. Pass
  ``raising=False`` only for names of other libraries that may be absent (a faiss build without GPU functions).
- ``pytest.importorskip`` anywhere under tests/: a skip under CI is a check that silently never ran; use
  ``tests.components.require_modules`` (skips on a developer's machine, fails under ``CI=true``).
- a test function that checks nothing: no meaningful ``assert`` (``assert True``, a constant, or only
  ``x is not None`` / ``isinstance(x, T)`` do not count), no ``pytest.raises`` / ``warns`` / ``fail``, no library
  assertion (``numpy.testing.assert_allclose``), and no call of a helper of tests/ (``check_*`` or any name) or of
  a function defined in the test that itself checks something by these rules. An assert in a nested function the
  test never calls does not count, nor does ``subprocess.check_output``. It passes whatever the code does unless
  it raises.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
#: Every top-level package of the repository but tests/ (those pyproject.toml ships, launchers and planning
#: included, and bench), found on disk so that a new package is mclpipe's own from its first commit.
OWN_PACKAGES = tuple(sorted(p.parent.name for p in TESTS.parent.glob("*/__init__.py") if p.parent != TESTS))


def linted_files() -> list[Path]:
    """Every Python file under tests/: test files, conftest.py and the helper modules (tests/e2e/load.py, ...)."""
    return sorted(TESTS.rglob("*.py"))


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


def raising_argument(call: ast.Call) -> ast.expr | None:
    """``raising`` of ``monkeypatch.setattr(target, name, value, raising)`` / ``setattr("a.b", value, raising)`` /
    ``delattr(target, name, raising)`` / ``delattr("a.b", raising)``, by keyword or by position."""
    for keyword in call.keywords:
        if keyword.arg == "raising":
            return keyword.value
    dotted_string = bool(call.args) and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)
    position = {"setattr": 3, "delattr": 2}[call.func.attr] - dotted_string
    return call.args[position] if len(call.args) > position else None


def raising_false_on_own_names(path: Path, tree: ast.Module) -> list[str]:
    imports = imported_names(tree)
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("setattr", "delattr")
                and isinstance(raising := raising_argument(node), ast.Constant) and raising.value is False
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
NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def checks_nothing(test: ast.expr) -> bool:
    """An assertion that holds whatever the code does: a constant (``assert True``), or only ``x is not None`` /
    ``isinstance(x, T)`` (a value the test made is one; what it holds is not checked), alone or and-ed."""
    if isinstance(test, ast.Constant):
        return True
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return all(checks_nothing(value) for value in test.values)
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.IsNot)
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None):
        return True
    return isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "isinstance"


def own_nodes(function: ast.AST):
    """The nodes of a function's body, not those of the functions, lambdas and classes defined in it (yielded
    themselves): their code runs only where they are called."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, NESTED):
            stack.extend(ast.iter_child_nodes(node))


def module_functions(tree: ast.Module):
    """A module's functions and its classes' methods (the helpers a test may call)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from (n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def module_name(path: Path) -> str:
    """tests/unit/export_checks.py -> tests.unit.export_checks"""
    return ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)


class Checks:
    """Whether a test checks something: a meaningful ``assert``; ``pytest.raises`` / ``warns`` / ``fail``; a
    function of tests/ it calls (a helper of its own file or imported from tests/, under any name: ``check_*``,
    ``assert_*``, ...; a function defined in the test itself) that checks something by these rules; a library's
    assertion (``numpy.testing.assert_allclose``, ``mock.assert_called_once_with``: a name starting with ``assert``
    that is not one of tests/). ``subprocess.check_output`` is none of these, nor an assert in a nested function the
    test never calls, nor a helper that asserts only ``True``."""

    def __init__(self, parsed: dict[Path, ast.Module]):
        self.helpers: dict[tuple[str, str], list[ast.AST]] = {}  # (module, name) -> its definitions
        self.imports: dict[str, dict[str, str]] = {}  # module -> the names it imports -> what they stand for
        for path, tree in parsed.items():
            module = module_name(path)
            self.imports[module] = imported_names(tree)
            for function in module_functions(tree):
                self.helpers.setdefault((module, function.name), []).append(function)
        self.known: dict[tuple[str, str], bool] = {}

    def helper(self, key: tuple[str, str]) -> bool:
        if key not in self.known:
            self.known[key] = False  # a helper calling itself checks nothing by that call
            self.known[key] = all(self.function(f, module=key[0]) for f in self.helpers[key])
        return self.known[key]

    def of_tests(self, call: ast.Call, module: str) -> tuple[str, str] | None:
        """The function of tests/ a call reaches: a name of this module (``helper()``, ``self.helper()``) or one
        imported from tests/ (``check_x()`` from ``from tests.unit.export_checks import check_x``,
        ``export_checks.check_x()``); None for anything else."""
        parts = dotted(call.func)
        if not parts:
            return None
        if len(parts) == 1 or parts[0] in ("self", "cls"):
            if (module, parts[-1]) in self.helpers:
                return module, parts[-1]
        origin = self.imports[module].get(parts[0])
        if origin is None or origin.partition(".")[0] != "tests":
            return None
        dotted_name = ".".join([origin, *parts[1:]])
        owner, _, name = dotted_name.rpartition(".")
        return (owner, name) if (owner, name) in self.helpers else None

    def function(self, function: ast.AST, *, module: str) -> bool:
        nodes = list(own_nodes(function))
        local = {n.name: n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for node in nodes:
            if isinstance(node, ast.Assert) and not checks_nothing(node.test):
                return True
            if not isinstance(node, ast.Call):
                continue
            name = called_name(node)
            if isinstance(node.func, ast.Name) and name in local:
                if self.function(local.pop(name), module=module):  # each local function read once, where called
                    return True
            elif name in PYTEST_CHECKS and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "pytest":
                return True
            elif (key := self.of_tests(node, module)) is not None:
                if self.helper(key):
                    return True
            elif name.startswith("assert"):
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


def unchecked_tests(path: Path, tree: ast.Module, checks: Checks) -> list[str]:
    if not path.name.startswith("test_"):
        return []
    return [f"{where(path, f)} {f.name}" for f in collected_tests(tree)
            if not checks.function(f, module=module_name(path))]


# ---------------------------------------------------------------------------------------------------- the checks
@pytest.fixture(scope="module")
def parsed() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), filename=str(path)) for path in linted_files()}


def test_no_monkeypatch_with_raising_false_on_mclpipe_s_own_names(parsed):
    found = [hit for path, tree in parsed.items() for hit in raising_false_on_own_names(path, tree)]
    assert found == [], ("monkeypatch.setattr(..., raising=False) on mclpipe's own name: a rename would silently "
                         f"patch nothing; drop raising=False: {found}")


def test_no_importorskip_anywhere_in_the_tests(parsed):
    found = [hit for path, tree in parsed.items() for hit in importorskips(path, tree)]
    assert found == [], ("pytest.importorskip skips silently under CI; use tests.components.require_modules (skips "
                         f"on a developer's machine, fails under CI=true): {found}")


def test_every_test_asserts_something(parsed):
    checks = Checks(parsed)
    found = [hit for path, tree in parsed.items() for hit in unchecked_tests(path, tree, checks)]
    assert found == [], ("a test without a meaningful assert (not a constant, not only `is not None` / isinstance), "
                         "pytest.raises or a helper that asserts passes whatever the code does: " f"{found}")


def test_every_package_the_project_ships_is_its_own(parsed):
    """The packages pyproject.toml ships (and bench, tests' import of the benchmarks) are all in OWN_PACKAGES."""
    import tomllib
    project = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())
    shipped = {pattern.rstrip("*").rstrip(".") for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert shipped <= set(OWN_PACKAGES) and {"launchers", "bench", "contrastive"} <= set(OWN_PACKAGES), shipped


# ---------------------------------------------------------------------------------------------------- the lint's own
LINTED = '''
import subprocess

import numpy as np
import pytest
from contrastive.data import loading
from contrastive.modalities.image_text import grouped
from launchers import slurm
import faiss
from tests.unit import helping
from tests.unit.helping import check_stack, check_quietly


def test_patches(monkeypatch):
    monkeypatch.setattr(grouped, "LABEL_CHUNK", 64, raising=False)
    monkeypatch.setattr("contrastive.modalities.image_text.grouped.WRITE_CHUNK", 1, raising=False)
    monkeypatch.setattr(grouped, "WRITE_CHUNK", 1)
    monkeypatch.setattr(loading.os, "sched_getaffinity", len, raising=False)
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0, raising=False)
    monkeypatch.setattr(grouped, "LABEL_CHUNK", 64, False)
    monkeypatch.setattr("contrastive.modalities.image_text.grouped.WRITE_CHUNK", 1, False)
    monkeypatch.delattr(grouped, "LABEL_CHUNK", False)
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0, False)
    monkeypatch.setattr(slurm, "SBATCH", "sbatch", raising=False)
    assert grouped.LABEL_CHUNK == 64


def test_nothing():
    grouped.LABEL_CHUNK


def test_asserts_true():
    assert True


def test_asserts_a_constant():
    assert "the chunk is set"


def test_asserts_only_that_a_value_exists():
    chunk = grouped.LABEL_CHUNK
    assert chunk is not None


def test_asserts_only_a_type():
    assert isinstance(grouped.LABEL_CHUNK, int) and grouped.LABEL_CHUNK is not None


def test_calls_a_library_check():
    subprocess.check_output(["true"])


def test_nested_assert_never_called():
    def inner():
        assert grouped.LABEL_CHUNK == 64
    callback = lambda: pytest.fail("never called")


def test_nested_assert_called():
    def inner():
        assert grouped.LABEL_CHUNK == 64
    inner()


def test_raises():
    with pytest.raises(ValueError):
        int("x")


def test_helper_that_asserts():
    check_slots(3)


def test_helper_that_does_not():
    check_nothing(3)


def test_imported_helpers():
    check_stack()
    helping.check_stack()


def test_imported_helper_that_asserts_a_constant():
    check_quietly()


class TestGroup:
    def test_method(self):
        np.testing.assert_array_equal(1, 1)

    def test_own_helper(self):
        self.check_group()

    def test_empty_method(self):
        pass

    def check_group(self):
        assert grouped.WRITE_CHUNK == 1


def check_slots(n):
    assert grouped.LABEL_CHUNK == n


def check_nothing(n):
    print(n)


@pytest.fixture
def browser():
    return pytest.importorskip("playwright")
'''

HELPING = '''
import pytest
from contrastive.modalities.image_text import grouped


def check_stack():
    assert grouped.LABEL_CHUNK > 0


def check_quietly():
    assert True


def start(monkeypatch):
    monkeypatch.setattr(grouped, "LABEL_CHUNK", 1, raising=False)
    return pytest.importorskip("psycopg2")
'''


def test_the_lint_finds_what_it_names():
    """The checks on a test file and a helper module written to break each rule (each loophole of the old lint
    planted once), beside uses they allow."""
    path, helping = TESTS / "unit" / "test_linted.py", TESTS / "unit" / "helping.py"  # never written
    tree, helper_tree = ast.parse(LINTED), ast.parse(HELPING)
    at = lambda text, line: f"tests/unit/{text}:{line}"  # noqa: E731
    lines = {line.strip(): n for n, line in enumerate(LINTED.splitlines(), 1)}
    helper_lines = {line.strip(): n for n, line in enumerate(HELPING.splitlines(), 1)}
    assert raising_false_on_own_names(path, tree) == [at("test_linted.py", lines[s]) for s in (
        'monkeypatch.setattr(grouped, "LABEL_CHUNK", 64, raising=False)',
        'monkeypatch.setattr("contrastive.modalities.image_text.grouped.WRITE_CHUNK", 1, raising=False)',
        'monkeypatch.setattr(grouped, "LABEL_CHUNK", 64, False)',  # raising passed positionally
        'monkeypatch.setattr("contrastive.modalities.image_text.grouped.WRITE_CHUNK", 1, False)',
        'monkeypatch.delattr(grouped, "LABEL_CHUNK", False)',
        'monkeypatch.setattr(slurm, "SBATCH", "sbatch", raising=False)')]  # launchers is mclpipe's own
    assert raising_false_on_own_names(helping, helper_tree) == [  # a helper module is read too
        at("helping.py", helper_lines['monkeypatch.setattr(grouped, "LABEL_CHUNK", 1, raising=False)'])]
    checks = Checks({path: tree, helping: helper_tree})
    assert unchecked_tests(path, tree, checks) == [at("test_linted.py", f"{lines[f'def {name}():']} {name}") for name in (
        "test_nothing", "test_asserts_true", "test_asserts_a_constant", "test_asserts_only_that_a_value_exists",
        "test_asserts_only_a_type", "test_calls_a_library_check", "test_nested_assert_never_called",
        "test_helper_that_does_not", "test_imported_helper_that_asserts_a_constant")] + [
        at("test_linted.py", f"{lines['def test_empty_method(self):']} test_empty_method")]
    assert unchecked_tests(helping, helper_tree, checks) == []  # not a test file: its functions are helpers
    assert importorskips(path, tree) == [
        at("test_linted.py", lines['return pytest.importorskip(' + chr(34) + 'playwright' + chr(34) + ')'])]
    assert importorskips(helping, helper_tree) == [
        at("helping.py", helper_lines['return pytest.importorskip(' + chr(34) + 'psycopg2' + chr(34) + ')'])]


def test_the_lint_reads_every_file_of_tests_and_knows_every_package():
    files = {str(p.relative_to(TESTS)) for p in linted_files()}
    assert {"e2e/load.py", "e2e/stack.py", "unit/export_checks.py", "components.py", "conftest.py"} <= files
    assert {"launchers", "contrastive", "flows", "tasks", "pipeline_config", "bench"} <= set(OWN_PACKAGES)
    assert is_own("launchers.slurm") and not is_own("tests.components") and not is_own("faiss")
