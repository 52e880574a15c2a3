"""A run's parameters are data, not code: the check a pipeline flow makes first, before any compute, when it runs
from a deployment (the Prefect UI's "Custom run", the API, a schedule).

The run's config is compared with the config stored in its deployment at deploy time; a key the stored config's
``run_policy`` does not let a run change (``pipeline_config/run_policy.py``), or a changed path outside its
``path_roots``, fails the flow run with one line naming the key. A flow run without a deployment (``mclpipe run``,
tests) is its caller's own: nothing to compare with.
"""
from __future__ import annotations

from prefect import get_run_logger
from prefect.context import FlowRunContext

from contrastive.errors import ConfigError
from pipeline_config.loader import config_from_dict
from pipeline_config.run_policy import changed_keys, check_overrides


def deployment_of_this_run():
    """The deployment this flow run was started from (read from the server), or None."""
    context = FlowRunContext.get()
    deployment_id = getattr(getattr(context, "flow_run", None), "deployment_id", None)
    if deployment_id is None:
        return None
    from prefect.client.orchestration import get_client
    with get_client(sync_client=True) as client:
        return client.read_deployment(deployment_id)


def check_run_parameters(config) -> None:
    """Refuse (ConfigError, one line) a deployment's run that changes an operator-only key of its config."""
    deployment = deployment_of_this_run()
    if deployment is None:
        return
    stored = (deployment.parameters or {}).get("config")
    if not isinstance(stored, dict):
        raise ConfigError(f"deployment {deployment.name!r} stores no config to check this run against: redeploy it "
                          "with `mclpipe deploy` (or `mclpipe serve`)")
    try:
        deployed = config_from_dict(stored)
    except ConfigError as exc:
        raise ConfigError(f"the config stored in deployment {deployment.name!r} no longer validates ({exc}): "
                          "redeploy it with `mclpipe deploy`") from None
    check_overrides(deployed=deployed, run=config, deployment=deployment.name)
    changed = changed_keys(deployed=deployed, run=config)
    if changed:
        get_run_logger().info("run of deployment %r changes %s (allowed by its run_policy)", deployment.name,
                              ", ".join(changed))
