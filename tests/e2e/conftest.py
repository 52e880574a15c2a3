import os
from pathlib import Path

import pytest

# Stage 1 of the worker's pipeline trains long enough for the retry tests to kill it between its first checkpoint
# (step 4) and its end: 8 epochs of about 10 steps, checkpointed every 4 steps and logged every 2 to the stack's
# MLflow (on a loaded 2-core machine 300 steps took 197 s, so the 76 steps after the first checkpoint last tens of
# seconds; the kill comes within 0.05 s of it, and crash_in_stage1 fails with "make it longer" if stage 1 ever
# finished first). The other stages stay one epoch. Three flow runs train this stage (the browser's custom run and
# both retries), so its length is minutes of the slow suite.
WORKER_STAGE1_EPOCHS = 8
WORKER_STAGE1 = f"stage_overrides.1.train.epochs={WORKER_STAGE1_EPOCHS}"


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
