"""The tracking package's layout rules: mlflow is imported only inside ``tasks/tracking/`` (function-level imports
included), and everything outside it uses the Tracker's public methods, never its private plumbing or raw client."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("contrastive", "pipeline_config", "launchers", "tasks", "flows")


def python_files():
    return [p for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))]


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_mlflow_is_imported_only_in_the_tracking_package():
    package = ROOT / "tasks" / "tracking"
    importers = {p.relative_to(ROOT).as_posix() for p in python_files()
                 if any(m == "mlflow" or m.startswith("mlflow.") for m in imported_modules(p))}
    assert importers and all(name.startswith("tasks/tracking/") for name in importers), importers
    assert {p.name for p in package.glob("*.py")} == {"__init__.py", "client.py", "journal.py", "serving_model.py",
                                                       "registry.py"}


def test_outside_the_package_the_tracker_is_used_through_its_public_methods():
    private = re.compile(r"\btracker\._\w+|\btracker\.client\b")
    found = [f"{p.relative_to(ROOT)}:{n}" for p in python_files() if "tracking" not in p.relative_to(ROOT).parts
             for n, line in enumerate(p.read_text().splitlines(), 1) if private.search(line)]
    assert found == []


def test_the_public_api_is_importable_from_the_package():
    import tasks.tracking as tracking
    for name in tracking.__all__:
        assert getattr(tracking, name) is not None, name
    # The pyfunc model's class is pickled by value from its own small module, not from the whole package.
    assert tracking.EncoderModel.__module__ == "tasks.tracking.serving_model"
