import os
from pathlib import Path

import pytest

# Stage 1 of the worker's pipeline trains long enough (30 epochs of 8 steps) for the retry test to kill it between
# its first checkpoint and its end; the other stages stay one epoch.
WORKER_STAGE1 = "stage_overrides.1.train.epochs=30"


@pytest.fixture(scope="session")
def team_stack(tmp_path_factory):
    """The team stack (tests/e2e/stack.py), one for the session's slow stack, worker and UI tests. When they are
    done, no secret of the stack's .env may be in its databases, logs or artifacts (issue 36)."""
    from tests.e2e.stack import credentials_found, team_stack
    with team_stack(tmp_path_factory.mktemp("stack")) as stack:
        yield stack
        found = credentials_found(stack)
        assert not found, f"a credential of the stack's .env was written to: {found}"


@pytest.fixture(scope="session")
def team_stack_run(team_stack):
    """One tiny `mclpipe run` on the team stack, shared by the slow stack and UI tests."""
    from tests.e2e.stack import tiny_run_args
    result = team_stack.mclpipe("run", *tiny_run_args(team_stack.root, "name=stack_tiny"))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return team_stack, result


@pytest.fixture(scope="session")
def worker_deployment(team_stack):
    """The tiny pipeline deployed to a process work pool of the team stack, with a real worker running its flow
    runs (tests/e2e/worker.py)."""
    from tests.e2e.worker import worker_deployment
    with worker_deployment(team_stack, WORKER_STAGE1) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium driven by playwright (.ci/setup-browser.sh), for the UI tests: skipped where either is
    missing, failed under CI (tests/components.py)."""
    from tests.e2e.test_ui_browser import ARGS, CHROMIUM

    from tests.components import BROWSER, missing, require_modules

    playwright_api = require_modules("playwright.sync_api", fix=BROWSER)
    if not Path(CHROMIUM).exists():
        missing(f"no {CHROMIUM}", fix=BROWSER)
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def shots(tmp_path):
    out = Path(os.environ.get("MCLPIPE_UI_SCREENSHOTS") or tmp_path / "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out
