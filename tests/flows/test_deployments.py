"""`mclpipe serve` deployments: schedules from config, the typed config as the UI form's schema."""
import asyncio

from prefect.client.orchestration import get_client

from flows.deployments import build_deployments
from pipeline_config.schema import PipelineConfig


def test_deployments_carry_schedule_and_typed_parameters():
    cron, interval = build_deployments(["trifeature_tiny", "trifeature_mcl"],
                                       ["schedule.cron=0 3 * * *"])[0], None
    assert cron.name == "trifeature_tiny"
    assert cron.schedules[0].schedule.cron == "0 3 * * *"
    config = PipelineConfig.model_validate(cron.parameters["config"])
    assert config.name == "trifeature_tiny"
    interval = build_deployments(["trifeature_tiny"], ["schedule.interval_minutes=90"])[0]
    assert interval.schedules[0].schedule.interval.total_seconds() == 5400

    deployment_id = cron.apply()

    async def read():
        async with get_client() as client:
            return await client.read_deployment(deployment_id)

    stored = asyncio.run(read())
    assert stored.enforce_parameter_schema
    assert "PipelineConfig" in stored.parameter_openapi_schema["definitions"]
    assert stored.parameter_openapi_schema["definitions"]["TrainConfig"]["additionalProperties"] is False
    assert stored.schedules and stored.schedules[0].schedule.cron == "0 3 * * *"
