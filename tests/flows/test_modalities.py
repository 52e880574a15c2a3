"""Every modality through the one pipeline flow: the same MLflow run tree, the same Prefect artifacts and the same
final printout, whatever the data (images, image-text pairs, sentences, feature vectors)."""
import asyncio
import re

import pytest
from mlflow.tracking import MlflowClient
from rich.console import Console

from contrastive.modalities.registry import PACKAGES, modality_for
from flows.pipeline import mcl_pipeline
from pipeline_config.loader import load_config
from tests.flows.mlflow_runs import artifact_paths, run_tree

# Each modality's tiny preset, made smaller still: two stages, no control run, no combined model.
PRESETS = {
    "image": ("trifeature_tiny", ["mcl.num_stages=2", "mcl.clusters=4", "mcl.control=false",
                                "data.trifeature.num_train=128", "data.trifeature.num_test=64",
                                "train.batch_size=16"]),
    "clip": ("clip_tiny", ["train.max_steps_per_epoch=3", "data.synthetic.num_train=288", "eval.soup=false"]),
    "text": ("text_tiny", ["mcl.control=false"]),
    "embeddings": ("embeddings_tiny", ["mcl.control=false"]),
}


def test_every_registered_modality_has_a_tiny_preset_here():
    assert set(PRESETS) == set(PACKAGES)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """{pipeline key: (config, summary)} of one finished run of every modality, each with its own stores."""
    out = {}
    for key, (preset, overrides) in PRESETS.items():
        root = tmp_path_factory.mktemp(key)
        config = load_config(preset, [*overrides, f"output_dir={root / 'runs'}", f"data.cache_dir={root / 'data'}",
                                      f"tracking.uri=sqlite:///{root / 'mlflow.db'}", "device=cpu",
                                      "tracking.system_metrics_seconds=0"])
        out[key] = (config, mcl_pipeline(config))
    return out


def tree_shape(config, summary) -> dict:
    """What a person finds in MLflow, with the modality's own metric and file names left out."""
    client = MlflowClient(tracking_uri=config.tracking.uri)
    parents, children = run_tree(config.tracking.uri)
    parent = client.get_run(summary["mlflow_run_id"])
    files = artifact_paths(client, parent.info.run_id)
    stage_files = {c.data.tags["stage"]: artifact_paths(client, c.info.run_id) for c in children}
    return {
        "parents": [(p.info.status, p.data.tags["kind"]) for p in parents],
        "stages": sorted((c.data.tags["kind"], c.data.tags["stage"], c.info.status,
                          c.data.tags["mlflow.parentRunId"] == parent.info.run_id) for c in children),
        "parent files": sorted(f for f in files if f in {"config.yaml", "eval/summary.json", "eval/cluster_sizes.png",
                                                         "eval/mcl_concat/metrics.json"}),
        "stage files": {stage: sorted(f for f in paths if f.split("/")[0] in {"checkpoints", "model", "embeddings"}
                                      and f.endswith(("last.pt", "model.pt", "manifest.json", "ids.npy")))
                        for stage, paths in stage_files.items()},
        "between stages": sorted(f for f in stage_files["1"] if f in {"clusters/assignments.npz",
                                                                      "pseudo_labels/pseudo_labels.npz"}),
        "tags": sorted(t for t in parent.data.tags if t in {"pipeline_id", "config_hash", "prefect.flow_run_id",
                                                            "prefect.flow_run_url", "stage_run.mcl.stage.0",
                                                            "stage_run.mcl.stage.1", "mlflow.note.content"}),
        "results": sorted(summary["results"]),
        "model registered": "registered_uri" in summary.get("model", {}),
    }


def prefect_artifacts(summary) -> list[tuple[str, str]]:
    """(type, key without the pipeline's own names) of every Prefect artifact of the flow run."""
    async def read():
        from prefect.client.orchestration import get_client
        async with get_client() as prefect:
            flow_run_id = summary["prefect_flow_run_url"].rsplit("/", 1)[-1]
            response = await prefect._client.post("/artifacts/filter", json={
                "artifacts": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200, "offset": 0,
                "sort": "CREATED_DESC"})
            return response.json()
    kinds = set()
    for artifact in asyncio.run(read()):
        key = artifact.get("key") or ""
        kinds.add((artifact["type"], key.split("-")[0] if key else ""))
    return sorted(kinds)


def printout(config, summary) -> list[str]:
    """The final printout of `mclpipe run` with every number, name and URL replaced by a placeholder."""
    import flows.cli as cli
    console = Console(width=400, record=True, force_terminal=False)
    original, cli.console = cli.console, console
    try:
        cli.report(config, summary, elapsed=61.0)
    finally:
        cli.console = original
    shape = []
    for line in console.export_text().splitlines():
        line = re.sub(r"https?://\S+|sqlite:\S+|/\S+", "<path>", line)
        line = re.sub(r"\b[0-9a-f]{16}\b", "<id>", line)  # the pipeline id
        line = re.sub(r"\d+(\.\d+)?|nan", "<n>", line)
        shape.append("<table>" if set(line.strip()) <= set("━─│┃┏┓┗┛┡┩└┘┌┐├┤┼╇╋ ") else
                     re.sub(r"\b(stage|mcl|concat|control)\b", "<w>", line.split(":")[0].split("`")[0]))
    return shape


def test_the_run_tree_is_the_same_for_every_modality(finished):
    shapes = {key: tree_shape(config, summary) for key, (config, summary) in finished.items()}
    image = shapes["image"]
    assert image["stages"] == [("mcl", "0", "FINISHED", True), ("mcl", "1", "FINISHED", True)]
    assert image["results"] == ["MCL concat", "stage 0", "stage 1"] and image["model registered"]
    assert len(image["between stages"]) == 2 and all(len(files) == 4 for files in image["stage files"].values())
    for key, shape in shapes.items():
        assert shape == image, key


def test_the_prefect_artifacts_are_the_same_for_every_modality(finished):
    kinds = {key: prefect_artifacts(summary) for key, (_, summary) in finished.items()}
    # Prefect stores a link artifact as markdown: the results (markdown and table) and the links to MLflow.
    assert {("markdown", "results"), ("table", "results"), ("markdown", "mlflow")} <= set(kinds["image"])
    for key, found in kinds.items():
        assert found == kinds["image"], key


def test_the_final_printout_has_the_same_shape_for_every_modality(finished):
    shapes = {key: printout(config, summary) for key, (config, summary) in finished.items()}
    image = shapes["image"]
    assert any(line.startswith("wall time") for line in image) and any(line.startswith("MLflow") for line in image)
    assert any(line.startswith("model") for line in image) and any(line.startswith("Prefect") for line in image)
    for key, shape in shapes.items():
        # The tables differ by the modality's metrics; everything after them is line for line the same.
        tail = shape[next(i for i, line in enumerate(shape) if line.startswith("wall time")):]
        assert tail == image[next(i for i, line in enumerate(image) if line.startswith("wall time")):], key
        assert shape.count("<table>") >= 2, key


def test_each_modality_says_what_it_is_in_the_parent_run(finished):
    for key, (config, summary) in finished.items():
        parent = MlflowClient(tracking_uri=config.tracking.uri).get_run(summary["mlflow_run_id"])
        assert parent.data.tags["modality"] == modality_for(key).title


def test_the_plan_lists_every_step_a_run_made(finished):
    """`mclpipe plan`'s rows (flows.plan_steps.planned_steps: the runner's own loop with a recording step) are the
    steps a run makes, for every modality: the same step directories under output_dir/steps (issue 46)."""
    from pathlib import Path

    from flows.plan_steps import planned_steps
    for key, (config, _) in finished.items():
        data = modality_for(key).prepare_data(config, log=lambda _: None)  # prepared by the run: its data record
        planned = planned_steps(config, data=data)
        made = sorted(p.name for p in (Path(config.output_dir) / "steps").iterdir()
                      if p.is_dir() and not p.name.startswith("."))  # .locks: flows.locks' lock files
        assert planned[0].what == "prepare"
        assert sorted(step.step_dir for step in planned[1:]) == made, key


def test_the_plan_is_where_users_look(finished, tmp_path):
    """The plan of the run as `plan/plan.md` in the pipeline's MLflow run (a row per step) and as a table artifact
    of the flow run, and the flow run's progress artifact at 100 % with nothing left when the run has finished
    (issue 46)."""
    from pathlib import Path

    from flows.plan_steps import planned_steps

    async def progress_of(flow_run_id):
        from prefect.client.orchestration import get_client
        async with get_client() as prefect:
            response = await prefect._client.post("/artifacts/filter", json={
                "artifacts": {"flow_run_id": {"any_": [flow_run_id]}, "type": {"any_": ["progress"]}}, "limit": 200,
                "offset": 0, "sort": "CREATED_DESC"})
            return [(a["data"], a["description"]) for a in response.json()]
    for key, (config, summary) in finished.items():
        client = MlflowClient(tracking_uri=config.tracking.uri)
        text = Path(client.download_artifacts(summary["mlflow_run_id"], "plan/plan.md", str(tmp_path))).read_text()
        for step in planned_steps(config):
            assert f"| {step.title}" in text, (key, step.title)
        assert ("table", "plan") in prefect_artifacts(summary), key
        flow_run_id = summary["prefect_flow_run_url"].rsplit("/", 1)[-1]
        (plan_progress,) = [(data, d) for data, d in asyncio.run(progress_of(flow_run_id)) if "by the plan" in d]
        assert plan_progress[0] == 100.0 and plan_progress[1].endswith("no step left by the plan"), key


def test_no_file_of_a_finished_run_names_the_run_directory(finished):
    """A run directory moves (issue 47): what a finished run of each modality keeps under output_dir names its own
    files relative to it, step records, step summaries, Prefect's results and logged models alike. Allowed: the
    logs (history), Prefect's own note of where it wrote a result (``storage_key``), and the config as it was given
    (absolute here: the test names output_dir so)."""
    from pathlib import Path

    from tests.flows.run_paths import files_naming
    found = {key: files_naming(Path(config.output_dir), Path(config.output_dir), output_dir_given_absolute=True)
             for key, (config, _) in finished.items()}
    assert found == dict.fromkeys(finished, {}), found
