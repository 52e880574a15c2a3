"""bench/pipeline_overhead.py calls the train task as the flow does; its call must keep up with the task's
signature (a renamed argument once left `make bench` with an error row). Read from its source: importing the
module points Prefect at a private home, which a test process must not do."""
import ast
import inspect
from pathlib import Path

from tasks import steps as t


def test_the_benchmark_calls_the_train_task_with_its_current_arguments():
    source = ast.parse((Path(__file__).parents[2] / "bench" / "pipeline_overhead.py").read_text())
    calls = [node for node in ast.walk(source) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "run_step" and ast.unparse(node.args[0]) == "t.train_stage"]
    assert len(calls) == 1
    passed = {keyword.arg: None for keyword in calls[0].keywords if keyword.arg != "storage"}
    inspect.signature(t.train_stage.fn).bind(**passed)  # raises TypeError on a missing or unknown argument
