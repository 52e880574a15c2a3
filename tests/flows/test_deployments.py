"""`mclpipe serve` deployments: schedules from config, the typed config as the UI form's schema."""
import asyncio

from prefect.client.orchestration import get_client

from flows.deployments import build_deployments
from contrastive.modalities.image.config import ImagePipelineConfig


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
