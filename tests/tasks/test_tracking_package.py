"""The tracking package's layout rules: mlflow is imported only inside ``tasks/tracking/`` (function-level imports
included), and everything outside it uses the Tracker's public methods, never its private plumbing or raw client
(watched while a pipeline runs)."""
import ast
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
                                                       "registry.py", "relocate.py"}


def test_outside_the_package_the_tracker_is_used_through_its_public_methods(tmp_path, monkeypatch):
    """A tiny pipeline runs through the flow with every attribute read of its Tracker watched: no code of the
    layers outside ``tasks/tracking/`` reads a private attribute (``_*``) or the raw MLflow ``client`` (what the
    package's retries, outage handling and journal cannot cover), however it names the tracker; the watch sees
    the flow's public calls (it is not watching nothing)."""
    import sys

    from prefect.testing.utilities import prefect_test_harness

    from flows.pipeline import mcl_pipeline
    from pipeline_config.loader import load_config
    from tasks.tracking import Tracker
    package, layers = ROOT / "tasks" / "tracking", tuple(str(ROOT / layer) + "/" for layer in LAYERS)
    private, public = [], set()

    def watched(self, name):
        caller = sys._getframe(1).f_code.co_filename
        if caller.startswith(layers) and not caller.startswith(str(package) + "/"):
            where = f"{Path(caller).relative_to(ROOT)}:{sys._getframe(1).f_lineno}"
            if name == "client" or (name.startswith("_") and not name.startswith("__")):
                private.append(f"{where} reads tracker.{name}")
            elif not name.startswith("_"):
                public.add(name)
        return object.__getattribute__(self, name)
    monkeypatch.setattr(Tracker, "__getattribute__", watched)
    config = load_config("embeddings_tiny", [
        "mcl.control=false", "train.epochs=1", f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'data'}",
        f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "device=cpu", "tracking.system_metrics_seconds=0"])
    with prefect_test_harness(server_startup_timeout=120):
        mcl_pipeline(config)
    assert private == []
    assert {"start_run", "log_params", "log_metrics", "log_artifact", "set_tags"} <= public, public


def test_the_public_api_is_importable_from_the_package():
    import tasks.tracking as tracking
    for name in tracking.__all__:
        assert getattr(tracking, name) is not None, name
    # The pyfunc model's class is pickled by value from its own small module, not from the whole package.
    assert tracking.EncoderModel.__module__ == "tasks.tracking.serving_model"
