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


# `make test-slow` runs the slow tests in pytest-xdist processes with `--dist loadgroup`: the tests of one group run
# in one process, one after the other, because they share something only one of them may use at a time (the Makefile
# says which and why). A group is a set of files. xdist's own loadgroup reads `xdist_group` marks by renaming test
# ids, which pytest 9 no longer lets it do (its tests then spread over every process), so the grouping is a
# scheduler of ours: xdist's load-by-scope, with the scope of a test the group of its file, else the test itself.
XDIST_GROUP_FILES = {
    # the session's PostgreSQL stack and its worker (the `team_stack` fixture of tests/e2e/conftest.py)
    **dict.fromkeys(["test_team_stack.py", "test_ui_browser.py", "test_ui_deployment.py", "test_worker_retry.py",
                     "test_load.py"], "team_stack"),
    # the one-node Slurm cluster (OverSubscribe=NO: one job at a time)
    **dict.fromkeys(["test_slurm_flow.py", "test_slurm_real.py"], "slurm"),
    # the two-node Slurm cluster (.ci/setup-slurm-2node.sh; one job at a time, and one test kills a node of it)
    **dict.fromkeys(["test_slurm_two_nodes.py", "test_slurm_two_nodes_flow.py"], "slurm_two_nodes"),
    # the release test's wheel, venv and Prefect database template, built once for its six tests (module fixture)
    "test_wheel_install.py": "wheel",
    # the project's image, built once per process from this tree, and the containers and compose stack run from it
    # (tests/e2e/container.py; the stack's published ports are fixed)
    **dict.fromkeys(["test_container.py", "test_compose_stack.py"], "docker"),
}
XDIST_GROUP_FIXTURES = {"team_stack": "team_stack"}  # a test using the fixture must be in a file of its group


def xdist_scope(nodeid: str) -> str:
    """The scope a test is scheduled by: its file's group, else the test alone."""
    return XDIST_GROUP_FILES.get(nodeid.split("::", 1)[0].rsplit("/", 1)[-1], nodeid)


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedResourceScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return SharedResourceScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, group in XDIST_GROUP_FIXTURES.items():
            if fixture in item.fixturenames and XDIST_GROUP_FILES.get(item.path.name) != group:
                raise pytest.UsageError(f"{item.nodeid} uses the {fixture} fixture: add {item.path.name} to "
                                        f"XDIST_GROUP_FILES as {group!r} in tests/conftest.py, so it runs in the "
                                        "one process that holds it")
