"""A custom run from the deployment's form in a real browser (issue 16), executed by the team stack's worker:

Prefect deployment -> "Run" -> "Custom run" -> one field of the typed config changed (train.epochs 1 -> 2) ->
"Submit" -> the flow run page until it is Completed -> its Artifacts -> the link to the MLflow pipeline run -> the
results table -> the plots -> the registered model and its alias.

The deployment and the `prefect worker` that runs it are tests/e2e/worker.py's (shared with test_worker_retry.py);
screenshots go to $MCLPIPE_UI_SCREENSHOTS (`make ui-check`) or the test's tmp dir; docs/ui.md shows a curated set.
"""
import time

import pytest
from mlflow.tracking import MlflowClient

from pipeline_config.schema import ImagePipelineConfig
from tasks.tracking import TRAINING_VIEW
from tests.e2e.conftest import WORKER_STAGE1_EPOCHS
from tests.e2e.test_ui_browser import WAIT_MS, open_page, signed_in_page
from tests.e2e.worker import PIPELINE, api, flow_run

# a flow run through the worker may wait 900 s on a loaded machine (tests/e2e/worker.py), plus the stack's start
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

RUN_MS = 900_000  # the worker's flow run (a new process, two tiny stages, evaluation, the model): as long as
# tests/e2e/worker.py waits, since a CI run of 2026-11-27 took over 300 s for the retried run on the loaded 2 cores


def form_field(page, label: str):
    """The first input of the deployment form whose property is ``label`` (V1's schema form: the label is not
    bound to its input, so go from the label to its property block)."""
    return page.locator("label.p-label__label", has_text=label).first.locator("xpath=../..").locator(
        "textarea, input").first


def test_custom_run_from_the_deployment_form(worker_deployment, browser, shots):
    stack = worker_deployment.stack
    page = signed_in_page(browser, stack, viewport={"width": 1400, "height": 1000})

    # the deployment `mclpipe deploy` registered for the process pool
    text = open_page(page, f"{stack.prefect_url}/deployments/deployment/{worker_deployment.deployment_id}",
                     expect="flows/pipeline.py:mcl_pipeline", shot=shots / "10-prefect-deployment.png")
    assert PIPELINE in text and worker_deployment.pool in text and "Not Ready" not in text  # a worker polls it

    # Run -> Custom run: the typed config as a form; change one training value
    page.get_by_role("button", name="Run", exact=True).first.click()
    page.get_by_text("Custom run", exact=True).first.click()
    try:
        page.get_by_text("Num Stages (Optional)").first.wait_for(timeout=WAIT_MS)
    except Exception:
        page.screenshot(path=str(shots / "failed-custom-run-form.png"), full_page=True)  # what the form showed
        raise
    epochs = form_field(page, "Epochs (Optional)")
    assert epochs.input_value() == "1"  # train.epochs of the deployed config
    epochs.fill("2")
    epochs.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    page.screenshot(path=str(shots / "11-prefect-custom-run-form.png"))
    page.get_by_role("button", name="Submit").click()
    page.get_by_text("scheduled to start now").first.wait_for(timeout=WAIT_MS)  # the notice, with "View run"
    [submitted] = api(stack, "/flow_runs/filter", {
        "flow_runs": {"deployment_id": {"any_": [worker_deployment.deployment_id]}},
        "sort": "EXPECTED_START_TIME_DESC", "limit": 1})
    flow_run_id = submitted["id"]
    config = ImagePipelineConfig.model_validate(flow_run(stack, flow_run_id)["parameters"]["config"])
    # only the changed field: stage 1 keeps the deployment's own epochs
    assert config.train.epochs == 2 and config.for_stage(1).train.epochs == WORKER_STAGE1_EPOCHS

    # the worker runs it; the flow run page follows it to Completed, named after the config
    worker_deployment.wait(flow_run_id, {"COMPLETED"}, seconds=RUN_MS / 1000)
    page.goto(f"{stack.prefect_url}/runs/flow-run/{flow_run_id}")  # where "View run" leads
    page.get_by_text("Completed", exact=True).first.wait_for(timeout=WAIT_MS)
    page.locator("canvas").first.wait_for(timeout=WAIT_MS)  # the flow run graph
    page.wait_for_timeout(5000)  # its first layout is slow on a loaded machine
    page.screenshot(path=str(shots / "12-prefect-custom-flow-run.png"), full_page=True)
    pipeline_id = config.config_hash()
    assert f"{PIPELINE} image {pipeline_id[:8]}" in page.inner_text("body")

    # its artifacts: the link to the MLflow pipeline run
    page.get_by_text("Artifacts", exact=True).first.click()
    key = f"mlflow-{PIPELINE.replace('_', '-')}-{pipeline_id[:8]}"
    page.get_by_text(key, exact=True).first.click()
    link = page.locator("a", has_text=f"MLflow: {PIPELINE} pipeline run").first
    link.wait_for(timeout=WAIT_MS)
    href = link.get_attribute("href")
    client = MlflowClient(tracking_uri=stack.mlflow_url)
    [parent] = client.search_runs([client.get_experiment_by_name("mclpipe-worker").experiment_id],
                                  f"tags.`prefect.flow_run_id` = '{flow_run_id}' and tags.kind = 'pipeline'")
    assert href.startswith(stack.mlflow_url) and f"/runs/{parent.info.run_id}{TRAINING_VIEW}" in href
    assert parent.data.params["train.epochs"] == "2"

    # MLflow: the pipeline run, the results table on top
    text = open_page(page, href, expect="MCL concat", shot=shots / "13-mlflow-custom-run.png")
    concat = parent.data.metrics["eval/mcl_concat/probe/shape"]
    assert "Model training" in text and f"{concat:.3f}" in text and f"{PIPELINE}@current" in text

    # the plots it logged: the probe accuracy per attribute, shown as a picture
    plot_url = href.replace(TRAINING_VIEW, f"/artifacts/eval/probe_accuracy.png{TRAINING_VIEW}")
    text = open_page(page, plot_url, expect="eval/probe_accuracy.png", shot=shots / "14-mlflow-plot.png")
    assert "knn_accuracy.png" in text and "cluster_sizes.png" in text
    picture = page.locator("img[src*='probe_accuracy.png'], img[src^='blob:']").first
    picture.wait_for(timeout=WAIT_MS)
    assert picture.evaluate("img => img.naturalWidth") > 300

    # the registered model: the alias "current" is on the version this pipeline logged
    version = client.get_model_version_by_alias(PIPELINE, "current")
    assert version.run_id == parent.info.run_id
    registry_url = stack.mlflow_url + f"/#/models/{PIPELINE}"
    text = open_page(page, registry_url, expect="current", shot=shots / "15-mlflow-registered-model.png")
    assert f"Version {version.version}" in text
    page.context.close()


def test_the_retry_button_of_a_crashed_flow_run(worker_deployment, browser, shots):
    """The flow run's process killed mid stage 1 (tests/e2e/test_worker_retry.py's crash, on a config of its own:
    seed 1), then the Retry button of the flow run's page pressed in the browser: the worker runs it to Completed,
    and the state the button set is the one test_worker_retry.py sends."""
    from tests.e2e.test_worker_retry import crash_in_stage1

    stack = worker_deployment.stack
    deployed = api(stack, f"/deployments/{worker_deployment.deployment_id}", method="GET")["parameters"]["config"]
    crash = crash_in_stage1(worker_deployment, parameters={"config": {**deployed, "seed": 1}})
    page = signed_in_page(browser, stack, viewport={"width": 1400, "height": 1000})
    url = f"{stack.prefect_url}/runs/flow-run/{crash.flow_run_id}"
    text = open_page(page, url, expect="Crashed", shot=shots / "16-prefect-crashed-flow-run.png")
    assert crash.crashed["name"] in text

    page.get_by_role("button", name="Retry", exact=True).first.click()
    page.get_by_text("This will retry flow run").first.wait_for(timeout=WAIT_MS)
    page.wait_for_timeout(500)
    page.screenshot(path=str(shots / "17-prefect-retry.png"))
    crashed_now = flow_run(stack, crash.flow_run_id)  # the Crashed state the button leaves
    page.get_by_role("button", name="Retry", exact=True).last.click()  # the dialog's

    # the page sends the new state a moment after the click: until it lands, the run still reads Crashed
    deadline = time.time() + 60
    while flow_run(stack, crash.flow_run_id)["state"]["id"] == crashed_now["state"]["id"]:
        assert time.time() < deadline, "the dialog's Retry left the flow run Crashed for 60 s"
        time.sleep(0.5)
    done = worker_deployment.wait(crash.flow_run_id, {"COMPLETED"}, seconds=RUN_MS / 1000, leaving=crashed_now)
    assert done["run_count"] == 2
    states = api(stack, f"/flow_run_states/?flow_run_id={crash.flow_run_id}", method="GET")
    history = [(s["type"], s["name"], s["message"]) for s in states]
    assert ("SCHEDULED", "AwaitingRetry", "Retry from the UI") in history, history
    text = open_page(page, url, expect="Completed", shot=shots / "18-prefect-retried-flow-run.png")
    assert crash.crashed["name"] in text
    page.context.close()
