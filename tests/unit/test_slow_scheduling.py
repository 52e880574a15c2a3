"""tests/conftest.py's scheduling of `make test-slow`: the tests of a shared singleton's files run in one process."""
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import XDIST_GROUP_FILES, xdist_scope

REPO = Path(__file__).resolve().parents[2]

RECORDING_TEST = """
import json, os
def test_{name}_a(): open({log!r}, "a").write(json.dumps(["{name}", os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
def test_{name}_b(): open({log!r}, "a").write(json.dumps(["{name}", os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
def test_{name}_c(): open({log!r}, "a").write(json.dumps(["{name}", os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
"""


def test_a_groups_files_share_one_scope_and_other_tests_are_their_own():
    stack = [xdist_scope(f"tests/e2e/{name}::test_x") for name, group in XDIST_GROUP_FILES.items()
             if group == "team_stack"]
    assert set(stack) == {"team_stack"} and len(stack) == 5
    assert xdist_scope("tests/launchers/test_slurm_real.py::test_a") == xdist_scope(
        "tests/flows/test_slurm_flow.py::test_b") == "slurm"
    assert xdist_scope("tests/faults/test_kill_resume.py::test_a") == "tests/faults/test_kill_resume.py::test_a"


def test_under_loadgroup_a_groups_tests_run_in_one_process(tmp_path):
    """Two pytest-xdist processes over three files: the two team-stack files' six tests in one process (twice, so a
    lucky split cannot pass it)."""
    log = tmp_path / "ran.jsonl"
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_xdist_make_scheduler  # noqa: F401\n")
    for file, name in (("test_load.py", "load"), ("test_team_stack.py", "stack"), ("test_plain.py", "plain")):
        (tmp_path / file).write_text(RECORDING_TEST.format(name=name, log=str(log)))
    for _ in range(2):
        log.unlink(missing_ok=True)
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                                 "no:cacheprovider", "-p", "no:randomly", str(tmp_path)], cwd=tmp_path,
                                env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        ran = [json.loads(line) for line in log.read_text().splitlines()]
        assert len(ran) == 9
        assert len({worker for name, worker in ran if name in ("load", "stack")}) == 1, ran
