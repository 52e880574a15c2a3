import pytest


@pytest.fixture(scope="session")
def team_stack_run(tmp_path_factory):
    """The team stack (tests/e2e/stack.py) and one tiny `mclpipe run` on it, shared by the slow stack and UI tests."""
    from tests.e2e.stack import team_stack, tiny_run_args
    with team_stack(tmp_path_factory.mktemp("stack")) as stack:
        result = stack.mclpipe("run", *tiny_run_args(stack.root, "name=stack_tiny"))
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
        yield stack, result
