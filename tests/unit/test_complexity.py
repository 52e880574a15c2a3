"""No function of the orchestration and planning layers (flows/, tasks/, planning/) is more tangled than radon's
grade C (cyclomatic complexity up to 20): a function graded D or worse (21+ independent paths, e.g. the planner's
54-branch if/elif over step kinds, radon F, before issue 57) is split into small parts behind a table or a helper
before it lands. radon (PyPI, the test extra) reads the source; nothing is imported or run."""
from pathlib import Path

from tests.components import require_modules

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("flows", "tasks", "planning")
WORST = "C"


def graded_worse(source: str, *, worst: str = WORST) -> list[str]:
    """Every function and method of ``source`` graded worse than ``worst``, as "name (grade complexity)"."""
    radon = require_modules("radon.complexity", fix="pip install -e '.[test]' (make install)")
    functions = [block for block in radon.cc_visit(source) if block.letter in "FM"]  # methods: M
    return [f"{f.fullname} ({radon.cc_rank(f.complexity)} {f.complexity}), line {f.lineno}"
            for f in functions if radon.cc_rank(f.complexity) > worst]


def test_no_function_in_flows_tasks_and_planning_is_graded_worse_than_c():
    files = [path for package in CHECKED for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 30  # the packages were read, not an empty tree
    found = {str(path.relative_to(ROOT)): worse for path in files if (worse := graded_worse(path.read_text()))}
    assert found == {}, "split these functions (radon cc -s -n D flows tasks planning): " + repr(found)


def test_a_function_with_21_branches_is_caught():
    """The check fails where it should: one function of 21 if-branches (complexity 22, grade D) is named, a method
    too; 19 branches (grade C) pass."""
    def function(name: str, branches: int, indent: str = "") -> str:
        body = "".join(f"{indent}    if x == {i}:\n{indent}        return {i}\n" for i in range(branches))
        return f"{indent}def {name}(x):\n{body}{indent}    return -1\n"
    assert graded_worse(function("tangled", 21)) == ["tangled (D 22), line 1"]
    assert graded_worse("class Runner:\n" + function("step", 25, indent="    ")) == ["Runner.step (D 26), line 2"]
    assert graded_worse(function("fine", 19)) == []
