import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

import pytest  # noqa: E402

from pipeline_config.loader import load_config  # noqa: E402


@pytest.fixture
def tiny_config(tmp_path):
    """The seconds-long preset, writing everything (data, steps, MLflow db and artifacts) under tmp_path."""
    def make(*overrides: str):
        return load_config("trifeature_tiny", [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'data'}",
                                               f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", *overrides])
    return make


# `make test-slow` runs the slow tests in pytest-xdist processes with `--dist loadgroup`: the tests in one group run
# in one process, one after the other, because they share something only one of them may use at a time (the Makefile
# says which and why). Groups by the fixture a test uses, or by its file.
XDIST_GROUP_FIXTURES = {"team_stack": "team_stack"}  # the session's PostgreSQL stack and its worker (tests/e2e)
XDIST_GROUP_FILES = {"test_slurm_flow.py": "slurm", "test_slurm_real.py": "slurm"}  # the one-node Slurm cluster


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the markers into the test ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        groups = {group for fixture, group in XDIST_GROUP_FIXTURES.items() if fixture in item.fixturenames}
        if item.path.name in XDIST_GROUP_FILES:
            groups.add(XDIST_GROUP_FILES[item.path.name])
        for group in sorted(groups):
            item.add_marker(pytest.mark.xdist_group(group))
